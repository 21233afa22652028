package redisstore

import (
	"hash/maphash"
	"slices"
	"sync"
	"time"

	"github.com/floodgate/floodgate"
)

// denials is the local denial cache (Options.DenialCache): when Redis
// denies a request with a retry-after, requests for the same key, limits
// and cost are denied locally until that time, without a round trip, with
// the RetryAfter that Redis would give: the one it gave, less the time
// since. (A higher cost would be denied too, but for longer than the
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
// cache lets go no later than Redis would. What it cannot see is a Reset
// of the key by another process: a key reset elsewhere stays denied here
// until the retry-after passes (a Reset through this Store clears it).
type denials struct {
	seed   maphash.Seed
	shards [denialShards]denialShard
	now    func() time.Time // monotonic
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
	limits []floodgate.Limit
	n      int64
	sent   time.Time // when the denied request was sent
	until  time.Time // sent + RetryAfter
	res    floodgate.Result
}

func newDenials(now func() time.Time) *denials {
	d := &denials{seed: maphash.MakeSeed(), now: now}
	for i := range d.shards {
		d.shards[i].m = map[string]*denial{}
	}
	return d
}

// cacheable reports whether a denial of these limits may be cached.
func cacheable(limits []floodgate.Limit) bool {
	for _, l := range limits {
		if l.Algorithm() == floodgate.AlgorithmSlidingWindow {
			return false
		}
	}
	return true
}

func (d *denials) shard(key string) *denialShard {
	return &d.shards[maphash.String(d.seed, key)%denialShards]
}

// get returns the cached denial that answers a request of cost n on key
// under limits, if there is one.
func (d *denials) get(key string, limits []floodgate.Limit, n int64) (floodgate.Result, bool) {
	if n == 0 {
		return floodgate.Result{}, false
	}
	sh := d.shard(key)
	sh.mu.Lock()
	e := sh.m[key]
	if e == nil {
		sh.mu.Unlock()
		return floodgate.Result{}, false
	}
	now := d.now()
	if !now.Before(e.until) {
		delete(sh.m, key)
		sh.mu.Unlock()
		return floodgate.Result{}, false
	}
	if n != e.n || !slices.Equal(e.limits, limits) {
		sh.mu.Unlock()
		return floodgate.Result{}, false
	}
	res := e.res
	sh.mu.Unlock()
	elapsed := now.Sub(e.sent)
	res.RetryAfter -= elapsed
	res.ResetAfter = max(res.ResetAfter-elapsed, res.RetryAfter)
	res.Source = floodgate.SourceCache
	return res, true
}

// put records a denial by Redis of a request of cost n sent at sent.
func (d *denials) put(key string, limits []floodgate.Limit, n int64, sent time.Time, res floodgate.Result) {
	if res.Allowed || n == 0 || res.RetryAfter == floodgate.Never || res.RetryAfter <= 0 || !cacheable(limits) {
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
	sh.m[key] = &denial{limits: slices.Clone(limits), n: n, sent: sent, until: sent.Add(res.RetryAfter), res: res}
}

// forget drops key's denial, after a Reset.
func (d *denials) forget(key string) {
	sh := d.shard(key)
	sh.mu.Lock()
	delete(sh.m, key)
	sh.mu.Unlock()
}
