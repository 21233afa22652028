package floodgate

import (
	"context"
	"errors"
	"hash/maphash"
	"math/bits"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/floodgate/floodgate/core"

	"github.com/floodgate/floodgate/internal/lib/storekit"
)

// MemoryOptions configures NewMemoryStore. The zero value (or nil) gives the
// defaults.
type MemoryOptions struct {
	// Clock is the store's time source. Default: SystemClock().
	Clock Clock
	// MaxKeys bounds how many keys the store holds. Default: 1,048,576.
	MaxKeys int
	// MaxBytes bounds the memory the store's keys take: their bytes, their
	// states and their sliding logs' entries, counted as the store
	// allocates them, so that long keys cannot exhaust memory as short
	// ones would not. Default: 192 MiB, which keeps the process under
	// 512 MB of RSS with 512-byte keys.
	//
	// A store at either bound evicts before it adds a key, fairly under
	// floods: a key starts on probation and is protected from its second
	// decision on, and eviction takes the oldest key on probation first. A
	// flood of new keys so evicts its own keys and never the state of
	// clients that came back. Keys back to full are removed by the
	// sweeper; Evictions counts the keys evicted before they were.
	MaxBytes int64
	// Shards is the number of independently locked parts of the store, so
	// that keys coming and going in one part do not hold up another. A
	// decision on a key the store already holds takes that key's own lock,
	// not its shard's. Default: 64; rounded up to a power of two.
	Shards int
	// SweepInterval is how often a background goroutine removes the keys
	// that are back to full. Default: one minute. A negative value turns the
	// goroutine off; keys are then removed only when their shard needs room
	// or Sweep is called.
	SweepInterval time.Duration
}

// MemoryStore is the embedded in-memory Store, floodgate's default. It
// keeps state in process memory, so it limits one process; use the Redis
// store to share limits between processes.
//
// A MemoryStore is safe for concurrent use. Deciding a request on a key it
// already holds does not allocate (except for a sliding log that needs a
// larger buffer). Keys are removed once every limit on them is back to
// full: their absence means the same thing.
type MemoryStore struct {
	clock       Clock
	sys         *systemClock // clock, when it is the system clock
	seed        maphash.Seed
	shards      []memShard
	shift       uint  // a key's shard is its hash's top bits: hash >> shift
	maxPerShard int   // keys
	bytesShard  int64 // bytes
	evictions   atomic.Uint64

	// rebased records, per scope, the limits of its keys (see Rebase).
	rebaseMu sync.Mutex
	rebased  map[string][]core.Spec

	// slots holds the concurrency limits' permits (memslots.go).
	slots memSlots

	closed    atomic.Bool
	closeOnce sync.Once
	stop      chan struct{}
	done      chan struct{}
}

var _ Store = (*MemoryStore)(nil)

// NewMemoryStore returns a new in-memory store configured by opts (nil for
// the defaults). Close it to stop its background sweeper.
func NewMemoryStore(opts *MemoryOptions) *MemoryStore {
	var c MemoryOptions
	if opts != nil {
		c = *opts
	}
	if c.Clock == nil {
		c.Clock = SystemClock()
	}
	if c.MaxKeys <= 0 {
		c.MaxKeys = 1 << 20
	}
	if c.MaxBytes <= 0 {
		c.MaxBytes = 192 << 20
	}
	if c.Shards <= 0 {
		c.Shards = 64
	}
	if c.Shards > c.MaxKeys {
		c.Shards = c.MaxKeys
	}
	if c.SweepInterval == 0 {
		c.SweepInterval = time.Minute
	}
	n := 1 << bits.Len(uint(c.Shards-1))
	sys, _ := c.Clock.(*systemClock)
	s := &MemoryStore{
		sys:         sys,
		clock:       c.Clock,
		seed:        maphash.MakeSeed(),
		shards:      make([]memShard, n),
		shift:       uint(64 - bits.Len(uint(n-1))),
		maxPerShard: max(1, c.MaxKeys/n),
		bytesShard:  max(1, c.MaxBytes/int64(n)),
		stop:        make(chan struct{}),
		done:        make(chan struct{}),
	}
	for i := range s.shards {
		s.shards[i].init()
	}
	s.slots.maxKeys = max(1, c.MaxKeys/len(s.slots.shards))
	if c.SweepInterval > 0 {
		go s.sweeper(c.SweepInterval)
	} else {
		close(s.done)
	}
	return s
}

// Prepare implements Store.
func (s *MemoryStore) Prepare(limits []core.Spec) (core.Policy, error) {
	if err := storekit.CheckSpecs(limits); err != nil {
		return nil, err
	}
	if s.closed.Load() {
		return nil, ErrClosed
	}
	return &memPolicy{s: s, specs: slices.Clone(limits)}, nil
}

// memPolicy is the memory store's Policy.
type memPolicy struct {
	s     *MemoryStore
	specs []core.Spec
}

// Take implements core.Policy.
func (p *memPolicy) Take(ctx context.Context, key string, n int64) (core.Decision, error) {
	return p.take(ctx, key, n, opTake)
}

// op is what a decision does with its cost.
type op uint8

const (
	opTake   op = iota // charge it if every limit allows (Step)
	opCharge           // charge it whatever the limits say (Charge)
	opRefund           // give it back (Refund)
)

// step runs l's step for o.
func (o op) step(l *core.Spec, st *core.State, now, n int64) (core.Verdict, core.Delta) {
	switch o {
	case opCharge:
		return l.Charge(st, now, n)
	case opRefund:
		return l.Refund(st, now, n)
	}
	return l.Step(st, now, n)
}

// cost is what Commit charges l for a cost of n under o: at most the
// quota for a charge, and minus that for a refund.
func (o op) cost(l *core.Spec, n int64) int64 {
	switch o {
	case opCharge:
		return min(n, l.Quota)
	case opRefund:
		return -min(n, l.Quota)
	}
	return n
}

// decide is Take without the Decision around its verdict and index, so
// that a Limiter on the memory store calls it directly (see
// Limiter.AllowN): on the hot path of the default store, the interface
// call and the copies through a Decision are a tenth of a decision.
func (p *memPolicy) decide(ctx context.Context, key string, n int64, o op) (core.Verdict, int, error) {
	// The checks are spelled out inline for the hot path; the core's
	// checks run only to say what is wrong.
	if key == "" || len(key) > MaxKeyLen || n < 0 {
		return core.Verdict{}, 0, storekit.CheckRequest(key, n)
	}
	s := p.s
	if s.closed.Load() {
		return core.Verdict{}, 0, ErrClosed
	}
	if err := ctx.Err(); err != nil {
		return core.Verdict{}, 0, err
	}
	now := s.now()
	h, sh := s.locate(key)
	if v, i, ok := p.fast(sh, h, key, now, n, o); ok {
		return v, i, nil
	}
	if len(p.specs) == 1 {
		v := s.takeOne(sh, h, key, &p.specs[0], now, n, o)
		if v.Retry == retryOverridden {
			return core.Verdict{}, 0, errOverridden
		}
		return v, 0, nil
	}
	sh.mu.Lock()
	if sh.ovr != nil && sh.override(key, now) != nil {
		sh.mu.Unlock()
		return core.Verdict{}, 0, errOverridden
	}
	v, i, _ := p.decideLocked(sh, h, key, now, n, o)
	sh.mu.Unlock()
	return v, i, nil
}

// errOverridden is decide's answer for a key with an override, which
// take then decides: it keeps the override's check off the hot path.
var errOverridden = errors.New("floodgate: key has an override")

// take is decide for the Policy's methods: it returns a Decision, and
// decides keys that have an override.
func (p *memPolicy) take(ctx context.Context, key string, n int64, o op) (core.Decision, error) {
	v, i, err := p.decide(ctx, key, n, o)
	if err == errOverridden {
		return p.takeOverridden(key, n, o), nil
	}
	return core.Decision{Verdict: v, Index: i}, err
}

// takeOverridden decides key against its override, or, if it has none by
// now, against p's limits.
func (p *memPolicy) takeOverridden(key string, n int64, o op) core.Decision {
	s := p.s
	h, sh := s.locate(key)
	sh.mu.Lock()
	now := s.now()
	q, limits := p, []core.Spec(nil)
	if ov := sh.override(key, now); ov != nil {
		q, limits = ov.pol, ov.pol.specs
	}
	v, i, _ := q.decideLocked(sh, h, key, now, n, o)
	sh.mu.Unlock()
	return core.Decision{Verdict: v, Index: i, Limits: limits}
}

// shard returns the shard that holds key.
func (s *MemoryStore) shard(key string) *memShard {
	_, sh := s.locate(key)
	return sh
}

// locate returns key's hash, which its entry keeps and the shard's index
// is probed with, and the shard that holds key: the hash's top bits. A
// decision hashes its key once, here.
func (s *MemoryStore) locate(key string) (uint64, *memShard) {
	h := maphash.String(s.seed, key)
	return h, &s.shards[h>>s.shift]
}

// fast decides key when the store holds it on protected (used before)
// and nothing else needs its shard: it takes the entry's lock alone, so
// that decisions on different keys share no lock and write no shared
// cache line, as x/time/rate's limiters do. It reports false, having
// decided nothing, when the shard's lock is needed: a new key, one to
// promote or to resize, a shard with overrides, or one a group, a
// change of limits or a removal holds (memShard.slow).
func (p *memPolicy) fast(sh *memShard, h uint64, key string, now, n int64, o op) (core.Verdict, int, bool) {
	e := sh.idx.lookup(h, key)
	if e == nil {
		return core.Verdict{}, 0, false
	}
	e.mu.Lock()
	// slow is read under e's lock, and first: whoever raises it takes e's
	// lock after, and may then change e without it, so a decision either
	// comes wholly before them or sees it and reads nothing more of e.
	if sh.slow.Load() != 0 || e.dead || !e.protected() || int(e.nlim) != len(p.specs) {
		e.mu.Unlock()
		return core.Verdict{}, 0, false
	}
	e.touch()
	var v core.Verdict
	var i int
	var grew bool
	if len(p.specs) == 1 {
		// e.states is e.one[:], on the line e.mu is on (see memEntry).
		v, e.full, grew = stepState(&e.one[0], &p.specs[0], now, n, o)
	} else {
		v, i, _, e.full, grew = p.decideStates(e.states, now, n, o)
	}
	e.mu.Unlock()
	if grew {
		sh.mu.Lock()
		p.s.account(sh, key, e, false, true, now)
		sh.mu.Unlock()
	}
	return v, i, true
}

// decideLocked decides key, whose hash is h, in sh, which the caller has
// locked, against every limit of p at now, and commits it. It reports
// whether the cost was charged.
func (p *memPolicy) decideLocked(sh *memShard, h uint64, key string, now, n int64, o op) (core.Verdict, int, bool) {
	s := p.s
	e := sh.get(h, key, s.bytesShard)
	if e == nil {
		// Decide on full states; keep them only if the key was charged.
		var sts [MaxLimits]core.State
		v, i, charged, full, _ := p.decideStates(sts[:len(p.specs)], now, n, o)
		// Nothing to give back to a key that is not there.
		charged = charged && o != opRefund
		if charged {
			e = newEntry(len(p.specs), h)
			copy(e.states, sts[:])
			e.full = full
			s.account(sh, key, e, true, false, now)
		}
		return v, i, charged
	}
	e.mu.Lock()
	resized := len(e.states) != len(p.specs)
	if resized {
		e.resize(len(p.specs))
	}
	v, i, charged, full, grew := p.decideStates(e.states, now, n, o)
	e.full = full
	e.mu.Unlock()
	if resized || grew {
		s.account(sh, key, e, false, true, now)
	}
	return v, i, charged
}

// decideStates decides sts, a key's states for p's limits, at now, and
// commits them. It reports whether the cost was charged, when the key is
// back to full (µs), and whether a state grew its buffer.
func (p *memPolicy) decideStates(sts []core.State, now, n int64, o op) (v core.Verdict, idx int, charged bool, full int64, grew bool) {
	var vs [MaxLimits]core.Verdict
	var next [MaxLimits]core.Delta
	allowed := true
	for i := range p.specs {
		st := &sts[i]
		if st.Kind != p.specs[i].Kind {
			*st = core.State{}
		}
		if o == opTake {
			vs[i], next[i] = p.specs[i].Step(st, now, n)
		} else {
			vs[i], next[i] = o.step(&p.specs[i], st, now, n)
		}
		allowed = allowed && vs[i].Allowed
	}
	charged = allowed && n > 0
	var hold int64
	for i := range p.specs {
		c := cap(sts[i].Log)
		p.specs[i].Commit(&sts[i], next[i], now, o.cost(&p.specs[i], n), charged)
		grew = grew || cap(sts[i].Log) != c
		hold = max(hold, p.specs[i].Hold(vs[i], next[i], now))
	}
	d := core.Decide(vs[:len(p.specs)])
	return d.Verdict, d.Index, charged, now + hold, grew
}

// TakeGroup implements core.Store.TakeGroup. It locks the shards of every key of
// reqs, in shard order so that concurrent groups cannot deadlock, decides
// the requests in order at one instant, and undoes an all-or-nothing group
// that a request denied, by refunding the others, before it unlocks. Each
// request's Policy must be one that s prepared.
func (s *MemoryStore) TakeGroup(ctx context.Context, reqs []core.Request, all bool) error {
	if err := storekit.CheckGroup(reqs); err != nil {
		return err
	}
	if s.closed.Load() {
		return ErrClosed
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	// A group's bookkeeping, on the stack for the common small groups.
	var polBuf [8]*memPolicy
	var hashBuf, shardBuf, lockBuf [8]uint64
	var chargedBuf [8]bool
	n := len(reqs)
	pols, hashes, shards, charged := polBuf[:], hashBuf[:], shardBuf[:], chargedBuf[:]
	if n > len(polBuf) {
		pols, hashes, shards, charged = make([]*memPolicy, n), make([]uint64, n), make([]uint64, n), make([]bool, n)
	}
	pols, hashes, shards, charged = pols[:n], hashes[:n], shards[:n], charged[:n]
	for i := range reqs {
		p, ok := reqs[i].Policy.(*memPolicy)
		if !ok || p.s != s {
			return storekit.ForeignPolicy(i, reqs[i].Policy)
		}
		pols[i] = p
		hashes[i] = maphash.String(s.seed, reqs[i].Key)
		shards[i] = hashes[i] >> s.shift
	}
	locks := append(lockBuf[:0], shards...)
	slices.Sort(locks)
	locks = slices.Compact(locks)
	for _, j := range locks {
		s.shards[j].mu.Lock()
		s.shards[j].slow.Add(1) // no decision between the group's and its undoing
	}
	now := s.now()
	for i := range reqs {
		r := &reqs[i]
		o := opTake
		if r.Force {
			o = opCharge
		}
		sh := &s.shards[shards[i]]
		var limits []core.Spec
		if sh.ovr != nil {
			if ov := sh.override(r.Key, now); ov != nil {
				pols[i], limits = ov.pol, ov.pol.specs
			}
		}
		v, idx, c := pols[i].decideLocked(sh, hashes[i], r.Key, now, r.N, o)
		r.Decision, charged[i] = core.Decision{Verdict: v, Index: idx, Limits: limits}, c
	}
	if all && storekit.Undo(reqs) {
		for i := len(reqs) - 1; i >= 0; i-- {
			if charged[i] {
				r := &reqs[i]
				v, idx, _ := pols[i].decideLocked(&s.shards[shards[i]], hashes[i], r.Key, now, r.N, opRefund)
				r.Decision = core.Decision{Verdict: v, Index: idx, Limits: r.Decision.Limits}
				storekit.Undone(&r.Decision)
			}
		}
	}
	for _, j := range slices.Backward(locks) {
		s.shards[j].slow.Add(-1)
		s.shards[j].mu.Unlock()
	}
	return nil
}

// Charge implements core.Policy.Charge.
func (p *memPolicy) Charge(ctx context.Context, key string, n int64) (core.Decision, error) {
	return p.take(ctx, key, n, opCharge)
}

// Refund implements core.Policy.Refund.
func (p *memPolicy) Refund(ctx context.Context, key string, n int64) (core.Decision, error) {
	return p.take(ctx, key, n, opRefund)
}

// Reset implements Policy: it forgets key.
func (p *memPolicy) Reset(ctx context.Context, key string) error {
	if err := storekit.CheckKey(key); err != nil {
		return err
	}
	s := p.s
	if s.closed.Load() {
		return ErrClosed
	}
	h, sh := s.locate(key)
	sh.mu.Lock()
	if e := sh.idx.lookup(h, key); e != nil {
		sh.remove(e, 0, false)
	}
	sh.mu.Unlock()
	return nil
}

// now reads the store's clock in microseconds.
func (s *MemoryStore) now() int64 {
	if s.sys != nil {
		return s.sys.micros()
	}
	return s.clock.Now().UnixMicro()
}

// retryOverridden is takeOne's Verdict.Retry for a key with an override,
// which it does not decide: no verdict has a negative Retry but
// core.NeverMicros.
const retryOverridden = -2

// takeOne decides a key with one limit under its shard's lock: the
// common case, without the arrays that several limits need. It decides
// nothing, and returns a Retry of retryOverridden, when the key has an
// override.
func (s *MemoryStore) takeOne(sh *memShard, h uint64, key string, l *core.Spec, now, n int64, o op) core.Verdict {
	sh.mu.Lock()
	if sh.ovr != nil && sh.override(key, now) != nil {
		sh.mu.Unlock()
		return core.Verdict{Retry: retryOverridden}
	}
	e := sh.get(h, key, s.bytesShard)
	if e == nil {
		// Decide on a full state; keep it only if the key was charged.
		var st core.State
		v, full, _ := stepState(&st, l, now, n, o)
		// Nothing to give back to a key that is not there.
		if v.Allowed && n > 0 && o != opRefund {
			e = newEntry(1, h)
			e.one[0], e.full = st, full
			s.account(sh, key, e, true, false, now)
		}
		sh.mu.Unlock()
		return v
	}
	e.mu.Lock()
	resized := len(e.states) != 1
	if resized {
		e.resize(1)
	}
	var v core.Verdict
	var grew bool
	v, e.full, grew = stepState(&e.one[0], l, now, n, o)
	e.mu.Unlock()
	if resized || grew {
		s.account(sh, key, e, false, true, now)
	}
	sh.mu.Unlock()
	return v
}

// stepState decides st, a key's state for its one limit l, at now, and
// commits it. It reports when the key is back to full (µs), and whether
// the state grew its buffer.
func stepState(st *core.State, l *core.Spec, now, n int64, o op) (v core.Verdict, full int64, grew bool) {
	if st.Kind != l.Kind {
		*st = core.State{}
	}
	var next core.Delta
	if o == opTake {
		v, next = l.Step(st, now, n)
	} else {
		v, next = o.step(l, st, now, n)
	}
	c := cap(st.Log)
	l.Commit(st, next, now, o.cost(l, n), v.Allowed && n > 0)
	return v, now + l.Hold(v, next, now), cap(st.Log) != c
}

// account adds a new entry e under key to sh, which is locked, or
// re-accounts one whose size changed, and evicts what the bounds require.
func (s *MemoryStore) account(sh *memShard, key string, e *memEntry, isNew, grew bool, now int64) {
	switch {
	case isNew:
		sh.add(key, e)
	case grew:
		sh.resized(e)
	default:
		return
	}
	if n := sh.makeRoom(s.maxPerShard, s.bytesShard, now, e); n > 0 {
		s.evictions.Add(uint64(n))
	}
}

func (e *memEntry) resize(n int) {
	old := e.states
	e.nlim = uint8(n)
	if n == 1 {
		e.states = e.one[:]
	} else {
		e.states = make([]core.State, n)
	}
	copy(e.states, old)
}

// Sweep removes every key that is back to full and returns how many it
// removed. The background sweeper calls it every SweepInterval.
func (s *MemoryStore) Sweep() int {
	now := s.now()
	removed := 0
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.Lock()
		sh.idx.all(func(e *memEntry) {
			if ok, _ := sh.remove(e, now, true); ok {
				removed++
			}
		})
		for key := range sh.ovr {
			sh.override(key, now) // drops it if it expired
		}
		sh.mu.Unlock()
	}
	return removed
}

// Len returns how many keys the store holds.
func (s *MemoryStore) Len() int {
	n := 0
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.Lock()
		n += sh.idx.n
		sh.mu.Unlock()
	}
	return n
}

// Evictions returns how many keys were evicted before they were back to
// full, because the store was at MaxKeys or MaxBytes.
func (s *MemoryStore) Evictions() uint64 { return s.evictions.Load() }

// Bytes returns the memory the store's keys take, as MaxBytes counts it.
func (s *MemoryStore) Bytes() int64 {
	var n int64
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.Lock()
		n += sh.bytes
		sh.mu.Unlock()
	}
	return n
}

func (s *MemoryStore) sweeper(every time.Duration) {
	defer close(s.done)
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-s.stop:
			return
		case <-t.C:
			s.Sweep()
		}
	}
}

// Close stops the background sweeper and makes further calls fail with
// ErrClosed. It is safe to call more than once.
func (s *MemoryStore) Close() error {
	s.closeOnce.Do(func() {
		s.closed.Store(true)
		close(s.stop)
	})
	<-s.done
	return nil
}
