package redisstore

import (
	"hash/maphash"
	"sync"
	"sync/atomic"
	"time"

	"github.com/floodgate/floodgate/core"
	"github.com/floodgate/floodgate/internal/lib/arith"
)

// denials is the local denial cache (Options.DenialCache): when Redis
// denies a request with a retry-after, requests for the same key, policy
// (the same limits, prepared once) and cost are denied locally until that
// time, without a round trip, with the retry that Redis would give: the
// one it gave, less the time since. (A higher cost would be denied too, but for longer than the
// cache knows; a lower one may fit.)
//
// It gives exactly Redis's answer (denied) because, for the algorithms it
// caches, nothing but time can make a denied request pass, and it waits
// for all of the time Redis named:
//
//   - token bucket, leaky bucket, GCRA: a denial changes nothing, and other
//     requests only move the bucket's TAT later; the retry is the instant
//     the TAT allows the cost.
//   - fixed window: the count only grows within the window; the retry is
//     the window's end.
//   - sliding log: other requests only add entries; the retry is the
//     instant enough entries leave the window.
//
// The sliding window counter is not cached: its retry is computed from an
// estimate that rounds, so it is not always the first instant at which
// the request would pass. Nor is a peek, or a cost that can never fit.
//
// Times are measured on the local monotonic clock from when the denied
// request was sent, which is no later than when Redis decided it, so the
// cache lets go no later than Redis would. What time does not explain, a
// refund, an override or a reset of the key by any process, is published
// by the script that makes it and drops the key's denial here (see
// lifts.go); the cache answers only while it hears those messages.
type denials struct {
	seed   maphash.Seed
	shards [denialShards]denialShard
	now    func() time.Time // monotonic
	// live is set while the Store is subscribed to the lifts.
	live atomic.Bool
}

// up starts answering from the cache: the subscription to the lifts is
// confirmed.
func (d *denials) up() { d.live.Store(true) }

// down stops answering and empties the cache: lifts may have been missed.
func (d *denials) down() {
	d.live.Store(false)
	for i := range d.shards {
		sh := &d.shards[i]
		sh.mu.Lock()
		clear(sh.m)
		sh.mu.Unlock()
	}
}

const (
	denialShards   = 32
	denialPerShard = 4096
)

type denialShard struct {
	mu sync.Mutex
	m  map[string]*denial
}

type denial struct {
	p     *policy
	n     int64
	sent  time.Time // when the denied request was sent
	until time.Time // sent + Retry
	d     core.Decision
}

func newDenials(now func() time.Time) *denials {
	d := &denials{seed: maphash.MakeSeed(), now: now}
	for i := range d.shards {
		d.shards[i].m = map[string]*denial{}
	}
	return d
}

// cacheable reports whether a denial on limits (a Policy's, or an
// override's) may be cached.
func cacheable(limits []core.Spec) bool {
	for i := range limits {
		if limits[i].Kind == core.Sliding {
			return false
		}
	}
	return true
}

func (d *denials) shard(key string) *denialShard {
	return &d.shards[maphash.String(d.seed, key)%denialShards]
}

// get returns the cached denial that answers a request of cost n on key
// under p, if there is one.
func (d *denials) get(key string, p *policy, n int64) (core.Decision, bool) {
	if n == 0 || !d.live.Load() {
		return core.Decision{}, false
	}
	sh := d.shard(key)
	sh.mu.Lock()
	e := sh.m[key]
	if e == nil {
		sh.mu.Unlock()
		return core.Decision{}, false
	}
	now := d.now()
	if !now.Before(e.until) {
		delete(sh.m, key)
		sh.mu.Unlock()
		return core.Decision{}, false
	}
	if n != e.n || e.p != p {
		sh.mu.Unlock()
		return core.Decision{}, false
	}
	dec := e.d
	sh.mu.Unlock()
	// Whole microseconds elapsed, rounded down: the retry stays rounded up.
	elapsed := int64(now.Sub(e.sent) / time.Microsecond)
	dec.Retry -= elapsed
	dec.Reset = max(dec.Reset-elapsed, dec.Retry)
	dec.Source = core.SourceCache
	return dec, true
}

// put records a denial by Redis of a request of cost n sent at sent.
func (d *denials) put(key string, p *policy, n int64, sent time.Time, dec core.Decision) {
	if dec.Allowed || n == 0 || dec.Retry <= 0 || !d.live.Load() || !cacheable(p.specs) || !cacheable(dec.Limits) {
		return
	}
	sh := d.shard(key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if len(sh.m) >= denialPerShard {
		// Make room: drop what has expired among a sample, or else one
		// entry, which only costs that key a round trip.
		now, seen, freed := d.now(), 0, false
		for k, e := range sh.m {
			if !now.Before(e.until) {
				delete(sh.m, k)
				freed = true
			}
			if seen++; seen == 32 {
				break
			}
		}
		if !freed {
			for k := range sh.m {
				delete(sh.m, k)
				break
			}
		}
	}
	sh.m[key] = &denial{p: p, n: n, sent: sent, until: sent.Add(arith.Duration(dec.Retry)), d: dec}
}

// settle tells the cache what Redis decided, dec, of a request of cost n
// sent at sent on key under p with op o: a take's denial is cached when
// keep says the caller may, and anything else drops the key's denial,
// since its state may have moved. A peek (n 0) changes nothing.
func (d *denials) settle(key string, p *policy, n int64, o op, sent time.Time, dec core.Decision, keep bool) {
	switch {
	case n == 0:
	case keep && o == opTake && !dec.Allowed:
		d.put(key, p, n, sent, dec)
	default:
		d.forget(key)
	}
}

// forget drops key's denial: it was reset, refunded or overridden.
func (d *denials) forget(key string) {
	sh := d.shard(key)
	sh.mu.Lock()
	delete(sh.m, key)
	sh.mu.Unlock()
}
