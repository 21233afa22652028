package redisstore

import (
	"context"
	"hash/maphash"

	"github.com/floodgate/floodgate"
	"github.com/floodgate/floodgate/core"
	"github.com/floodgate/floodgate/internal/lib/storekit"
)

// This file is core.Inspector for the Redis store: a peek that keeps
// every limit's verdict, and what this process holds of the key in its
// leases and its denial cache. It is for explaining decisions (floodgate
// serve's explain API), not for making them.

var _ core.Inspector = (*policy)(nil)

// Inspect implements core.Inspector. It peeks key in Redis (a request of
// cost 0, in one script call like any other, batched with them) past the
// lease and the denial cache, which it reads without changing: a
// cached denial stays, a lease keeps its units.
func (p *policy) Inspect(ctx context.Context, key string) (core.Inspection, error) {
	if err := storekit.CheckRequest(key, 0); err != nil {
		return core.Inspection{}, err
	}
	s := p.s
	if s.closed.Load() {
		return core.Inspection{}, floodgate.ErrClosed
	}
	c := s.get()
	defer s.put(c)
	p.fill(c, ctx, key, 0, s.nowArg(), opTake)
	if err := s.sendOne(c); err != nil {
		return core.Inspection{}, err
	}
	in := core.Inspection{Decision: c.decision(), Verdicts: make([]core.Verdict, c.count())}
	for i := range in.Verdicts {
		v := c.out[4*i:]
		in.Verdicts[i] = core.Verdict{Allowed: v[0] != 0, Remaining: v[1], Retry: v[2], Reset: v[3]}
	}
	if s.leases != nil && p.leaseK > 0 {
		in.Lease = s.leases.held(p, key)
	}
	if s.denials != nil {
		in.DenialCached = s.denials.cached(key, p)
	}
	return in, nil
}

// held returns the units left of the lease this process holds on key
// under p, 0 without one or once its time is up. It takes no lock and
// changes nothing.
func (l *leases) held(p *policy, key string) int64 {
	sh := l.shard(maphash.String(l.seed, key))
	ready := sh.ready.Load()
	if ready == nil {
		return 0
	}
	ls := (*ready)[leaseKey{p, key}]
	if ls == nil || l.micros() >= ls.expires {
		return 0
	}
	return ls.units.Load()
}

// cached reports whether the cache holds a denial of key under p that
// has not yet run out, whatever its cost. It changes nothing.
func (d *denials) cached(key string, p *policy) bool {
	if !d.live.Load() {
		return false
	}
	sh := d.shard(key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	e := sh.m[key]
	return e != nil && e.p == p && d.now().Before(e.until)
}
