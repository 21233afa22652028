package redisstore

import (
	"context"
	"hash/maphash"
	"maps"
	"sync"
	"sync/atomic"
	"time"

	"github.com/floodgate/floodgate/core"
	"github.com/floodgate/floodgate/internal/lib/arith"
)

// This file is the leases of Options.Leases. A process that sees a key
// of a lone bucket limit decided more than hotHits times within a lease's
// time takes, with its next request, a lease of several units in the
// same charge, and admits the key's next requests from it without a
// round trip. What is left when the lease's time is up goes back with a
// refund. Every unit a lease admits was taken from the shared limit
// first, so leases never over-admit; what they cost is that units held by
// one process wait there while another process's request on the key may
// be denied, for at most the lease's time and at most its units.

// LeaseOptions configures leases (see Options.Leases). The zero value
// gives the defaults.
type LeaseOptions struct {
	// Share is the largest lease as a fraction of the limit's quota (its
	// burst). Default: 0.01, a hundredth.
	Share float64
	// Time is the largest lease in time of the limit's rate, and how long
	// a lease lasts: what is left of it then goes back. A lease held by
	// one process delays another process's requests on the key by at most
	// this. Default: 10ms.
	Time time.Duration
}

// leaseSize returns the units of a lease on the bucket sp, or 0 when a
// lease would be less than 2 units (not worth it).
func (o *LeaseOptions) leaseSize(sp *core.Spec) int64 {
	byShare := int64(float64(sp.Quota) * o.Share)
	byTime, _ := arith.MulDiv(sp.Rate, o.Time.Microseconds(), sp.Period)
	k := min(byShare, byTime)
	if k < 2 {
		return 0
	}
	return k
}

const leaseShards = 16

// leases holds a Store's leases and its sweeper, which returns what is
// left of leases whose time is up.
type leases struct {
	s      *Store
	opts   LeaseOptions
	seed   maphash.Seed
	now    func() time.Time // monotonic unless a clock is injected
	shards [leaseShards]leaseShard
	// recent tells hot keys: a slot per hash of a key (its low bits),
	// which counts the key's decisions in a lease's time (see hot).
	recent [recentSlots]atomic.Uint64

	startOnce sync.Once
	stop      chan struct{}
	done      chan struct{}
}

type leaseShard struct {
	mu sync.Mutex
	m  map[leaseKey]*lease
	// ready is the granted leases of m, a map never changed once stored
	// (mu's holder stores a changed copy), so that a request admitted from
	// a lease takes no lock: under many goroutines on one hot key, the
	// shard's lock was the lease's cost.
	ready atomic.Pointer[map[leaseKey]*lease]
}

// recentSlots is the size of leases.recent, a power of two: 128 KiB.
const recentSlots = 1 << 14

// hotHits is how many decisions of a key within a lease's time make it
// hot: the next one takes a lease. Fewer made leases on keys decided in
// short bursts, which were given back nearly whole, at a cost to every
// decision; a key that stays hot decides alike either way.
// BenchmarkLeaseManyKeys guards it.
const hotHits = 8

// A slot of leases.recent: the top 16 bits of a key's hash, how many
// times it was decided in its window (up to 15), and when the window
// started (µs on leases.now's clock, its low 44 bits: 203 days).
const (
	slotTimeBits  = 44
	slotTimeMask  = 1<<slotTimeBits - 1
	slotCountMask = 0xf << slotTimeBits
	slotTagMask   = ^uint64(slotTimeMask | slotCountMask)
)

// hot records that the key of hash h goes through take at now (µs), and
// reports whether it did so more than hotHits times in a lease's time:
// in a window that started at its first decision since the last window
// ended. It takes no lock, and two decisions at once may count as one,
// which only delays a lease. Keys are told apart by the 16 bits of their
// hashes that the slot keeps: two keys in one slot add up as one (and may
// make a lease that is not needed) about once in 65,536 meetings, and a
// key that another one pushed out of its slot starts its window again.
// Hot keys, decided every few microseconds, keep their slots. Different
// limits on one key share it.
func (l *leases) hot(h uint64, now int64) bool {
	slot := &l.recent[h%recentSlots]
	old := slot.Load()
	tag, t := h&slotTagMask, uint64(now)&slotTimeMask
	start, count := t, uint64(1)
	// The times' difference on their 44 bits, which is large when the
	// clock went back.
	if old&slotTagMask == tag && (t-old)&slotTimeMask < uint64(l.opts.Time.Microseconds()) {
		start, count = old&slotTimeMask, min(old&slotCountMask>>slotTimeBits+1, 15)
	}
	slot.Store(tag | count<<slotTimeBits | start)
	return count > hotHits
}

type leaseKey struct {
	p   *policy
	key string
}

// lease is a key's lease. While fetching is set, a take of a lease is in
// flight and the key's other requests wait for it. Otherwise, until
// expires, units are left to admit; quota, remaining and reset are the
// take's answer, which the lease's admissions report with its own units
// added. A lease with cool set and no units sends the key's requests to
// Redis until expires: a take of a lease was refused.
//
// A granted lease's fields but units are set before it is published in
// its shard's ready map and never change after. units only goes down,
// by compare-and-swap (admit), or to 0 when the lease ends, so that a
// request admitted without the shard's lock is either before the end or
// refused.
type lease struct {
	fetching chan struct{}
	units    atomic.Int64
	expires  int64 // µs on leases.now's clock
	cool     bool
	verdict  core.Verdict
}

func newLeases(s *Store, o LeaseOptions, now func() time.Time) *leases {
	if o.Share <= 0 || o.Share > 1 {
		o.Share = 0.01
	}
	if o.Time <= 0 {
		o.Time = 10 * time.Millisecond
	}
	l := &leases{s: s, opts: o, seed: maphash.MakeSeed(), now: now, stop: make(chan struct{}), done: make(chan struct{})}
	for i := range l.shards {
		l.shards[i].m = make(map[leaseKey]*lease)
	}
	return l
}

func (l *leases) micros() int64 { return l.now().UnixMicro() }

// shard returns the shard of the key whose hash is h (maphash.String with
// l.seed).
func (l *leases) shard(h uint64) *leaseShard {
	return &l.shards[h%leaseShards]
}

// take decides a request of cost n on key under p, which has one bucket
// limit and a lease size k > 0: from the key's lease when it has one with
// n units left, and otherwise from Redis, with a lease of k units taken
// in the same charge when the key is hot. ok is false when Redis must
// decide the request the usual way.
func (l *leases) take(ctx context.Context, p *policy, key string, n int64) (d core.Decision, ok bool, err error) {
	lk := leaseKey{p, key}
	h := maphash.String(l.seed, key)
	sh := l.shard(h)
	now := l.micros()
	leased := false // the key has a granted lease, used up or ended
	if ready := sh.ready.Load(); ready != nil {
		if ls := (*ready)[lk]; ls != nil {
			if d, ok := ls.admit(p, n, now); ok {
				return d, true, nil
			}
			leased = true
		}
	}
	// A key is watched without a lock: most keys are not hot, and taking
	// the shard's lock and its maps for each of their decisions would
	// cost every decision (BenchmarkLeaseManyKeys guards it).
	if !leased && !l.hot(h, now) {
		return core.Decision{}, false, nil
	}
	for waited := false; ; {
		sh.mu.Lock()
		now = l.micros()
		ls := sh.m[lk]
		if ls != nil && ls.fetching != nil {
			ch := ls.fetching
			sh.mu.Unlock()
			select {
			case <-ch:
				waited = true
				continue
			case <-ctx.Done():
				return core.Decision{}, false, ctx.Err()
			}
		}
		var back int64 // units of an ended lease, to give back
		if ls != nil {
			if d, ok := ls.admit(p, n, now); ok {
				sh.mu.Unlock()
				return d, true, nil
			}
			if now < ls.expires && ls.cool {
				sh.mu.Unlock()
				return core.Decision{}, false, nil
			}
			back = sh.end(lk, ls)
		} else if waited {
			// The take of a lease that this request waited for ended in
			// an error: the request goes to Redis on its own.
			sh.mu.Unlock()
			return core.Decision{}, false, nil
		}
		ls = &lease{fetching: make(chan struct{})}
		sh.m[lk] = ls
		sh.mu.Unlock()
		l.startSweeper()
		return l.fetch(ctx, p, key, n, lk, sh, ls, back)
	}
}

// fetch gives back what an ended lease left, then takes n for the request
// and a new lease's units in one charge. When that is refused, or the key
// turns out to have an override, the key cools: its requests go to Redis
// one by one for a lease's time.
func (l *leases) fetch(ctx context.Context, p *policy, key string, n int64, lk leaseKey, sh *leaseShard, ls *lease, back int64) (core.Decision, bool, error) {
	k := p.leaseK
	err := l.giveBack(ctx, p, key, back)
	var d core.Decision
	if err == nil {
		d, err = p.take(ctx, key, n+k, opTake)
	}
	overridden := err == nil && d.Limits != nil
	if overridden && d.Allowed {
		// The override's limits decide the key, not the lease's: the
		// lease's units go back at once.
		err = l.giveBack(ctx, p, key, k)
	}
	sh.mu.Lock()
	close(ls.fetching)
	ls.fetching = nil
	ls.expires = l.micros() + l.opts.Time.Microseconds()
	granted := err == nil && d.Allowed && !overridden
	if granted {
		ls.units.Store(k)
		ls.verdict = d.Verdict
		d = ls.decision(p, k)
		d.Source = core.SourceStore // Redis decided this one
		sh.publish(lk, ls)
	} else {
		ls.cool = true
	}
	if err != nil {
		delete(sh.m, lk)
	}
	sh.mu.Unlock()
	if err != nil || !granted {
		// Redis decides the request itself.
		return core.Decision{}, false, err
	}
	return d, true, nil
}

// admit takes n units from ls, a lease no longer fetching, if it has them
// and its time is not up at now, and returns the request's decision. It
// needs no lock.
func (ls *lease) admit(p *policy, n, now int64) (core.Decision, bool) {
	if now >= ls.expires {
		return core.Decision{}, false
	}
	for {
		u := ls.units.Load()
		if u < n {
			return core.Decision{}, false
		}
		if ls.units.CompareAndSwap(u, u-n) {
			return ls.decision(p, u-n), true
		}
	}
}

// decision is the answer to a request admitted from ls, with units left
// after it: the take's, with those units counted as remaining, and the
// time they stand for taken off the reset. It is exact at the take, for a
// key that no other process uses.
func (ls *lease) decision(p *policy, units int64) core.Decision {
	d := core.Decision{Verdict: ls.verdict, Source: core.SourceLease}
	d.Remaining += units
	held, _ := arith.MulDiv(units, p.specs[0].Period, p.specs[0].Rate)
	d.Reset = max(d.Reset-held, 0)
	return d
}

// publish adds ls, just granted, to sh's ready map. sh is locked.
func (sh *leaseShard) publish(lk leaseKey, ls *lease) {
	var m map[leaseKey]*lease
	if old := sh.ready.Load(); old != nil {
		m = maps.Clone(*old)
	} else {
		m = make(map[leaseKey]*lease, 1)
	}
	m[lk] = ls
	sh.ready.Store(&m)
}

// end removes ls, the lease of lk, from sh, which is locked, and returns
// the units it had left: from then on it admits nothing.
func (sh *leaseShard) end(lk leaseKey, ls *lease) int64 {
	if old := sh.ready.Load(); old != nil && (*old)[lk] == ls {
		m := maps.Clone(*old)
		delete(m, lk)
		if len(m) == 0 {
			sh.ready.Store(nil)
		} else {
			sh.ready.Store(&m)
		}
	}
	delete(sh.m, lk)
	return ls.units.Swap(0)
}

// giveBack refunds n units of a lease on key (nothing when n is 0), in
// the batcher's next script call when the Store batches.
func (l *leases) giveBack(ctx context.Context, p *policy, key string, n int64) error {
	if n <= 0 {
		return nil
	}
	return l.s.sendOne(l.refund(ctx, p, key, n))
}

// refund returns the call that gives n units of a lease on key back.
func (l *leases) refund(ctx context.Context, p *policy, key string, n int64) *call {
	c := &call{}
	p.fill(c, ctx, key, n, l.s.nowArg(), opRefund)
	return c
}

// forget drops key's leases without giving their units back: the key was
// reset or overridden, and its state is Redis's again.
func (l *leases) forget(key string) {
	sh := l.shard(maphash.String(l.seed, key))
	sh.mu.Lock()
	for lk, ls := range sh.m {
		if lk.key == key && ls.fetching == nil {
			sh.end(lk, ls) // its units are dropped, not given back
		}
	}
	sh.mu.Unlock()
}

func (l *leases) startSweeper() {
	l.startOnce.Do(func() { go l.sweep() })
}

// sweep gives back, every lease's time, what is left of the leases whose
// time is up, until close.
func (l *leases) sweep() {
	defer close(l.done)
	t := time.NewTicker(l.opts.Time)
	defer t.Stop()
	for {
		select {
		case <-l.stop:
			return
		case <-t.C:
			l.returnEnded(false)
		}
	}
}

// returnEnded gives back what is left of every lease whose time is up, or
// of every lease when all is set.
func (l *leases) returnEnded(all bool) {
	type ended struct {
		lk leaseKey
		n  int64
	}
	var back []ended
	for i := range l.shards {
		sh := &l.shards[i]
		sh.mu.Lock()
		now := l.micros()
		for lk, ls := range sh.m {
			if ls.fetching == nil && (all || now >= ls.expires) {
				if n := sh.end(lk, ls); n > 0 {
					back = append(back, ended{lk, n})
				}
			}
		}
		sh.mu.Unlock()
	}
	// They go back together, in script calls of up to giveBackBatch
	// refunds (a call per slot on a Cluster): one at a time, a sweep
	// could not return within a lease's time the leases that a busy
	// process takes in it. A failure loses the units until they refill:
	// never an over-admission.
	calls := make([]*call, 0, min(len(back), giveBackBatch))
	for len(back) > 0 {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		calls = calls[:0]
		for _, e := range back[:min(len(back), giveBackBatch)] {
			calls = append(calls, l.refund(ctx, e.lk.p, e.lk.key, e.n))
		}
		back = back[len(calls):]
		l.s.send(ctx, calls)
		cancel()
	}
}

// giveBackBatch is the most refunds a sweep sends in one script call.
const giveBackBatch = 128

// close stops the sweeper and gives back what every lease has left.
func (l *leases) close() {
	started := false
	l.startOnce.Do(func() { close(l.done) }) // never started: nothing to wait for
	select {
	case <-l.done:
	default:
		started = true
	}
	if started {
		close(l.stop)
		<-l.done
	}
	l.returnEnded(true)
}
