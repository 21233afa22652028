package redisstore_test

import (
	"context"
	"testing"
	"time"

	"github.com/floodgate/floodgate"
	"github.com/floodgate/floodgate/internal/testkit/redistest"
	"github.com/floodgate/floodgate/redisstore"
	"github.com/floodgate/floodgate/storetest"
)

// Inspect tells what this process holds of a key, and changes none of
// it: a lease's units (and Redis's remaining without them), a cached
// denial (which still answers the next request).
func TestInspectLeaseAndDenialCache(t *testing.T) {
	srv := redistest.Start(t)
	ctx := context.Background()

	t.Run("lease", func(t *testing.T) {
		clock := storetest.NewClock(storetest.Base)
		st := newStore(t, srv.Client(t), &redisstore.Options{Prefix: "il:", Clock: clock, Leases: &redisstore.LeaseOptions{Share: 0.1, Time: 100 * time.Millisecond}})
		lim := limiter(t, st, floodgate.TokenBucket(100, time.Second, 1000)) // leases of 10
		in, err := lim.Inspect(ctx, "k")
		if err != nil || in.Lease != 0 || in.Results[0].Remaining != 1000 {
			t.Fatalf("cold key: %+v, %v; want no lease, 1000 left", in, err)
		}
		for i := 1; i <= 9; i++ { // the 9th is hot: it takes a lease of 10
			if r, err := lim.Allow(ctx, "k"); err != nil || !r.Allowed {
				t.Fatalf("decision %d: %+v, %v", i, r, err)
			}
		}
		for round := range 2 {
			in, err = lim.Inspect(ctx, "k")
			if err != nil || in.Lease != 10 || in.Remaining != 981 || in.Source != floodgate.SourceStore {
				t.Fatalf("round %d: hot key: lease %d, Redis's remaining %d, source %s, %v; want a lease of 10 and 981 in Redis", round, in.Lease, in.Remaining, in.Source, err)
			}
		}
		if r, err := lim.Allow(ctx, "k"); err != nil || r.Source != floodgate.SourceLease {
			t.Fatalf("the next request after Inspect: %+v, %v; want it from the lease", r, err)
		}
		clock.Advance(100 * time.Millisecond)
		if in, err = lim.Inspect(ctx, "k"); err != nil || in.Lease != 0 {
			t.Fatalf("after the lease's time: lease %d, %v; want none", in.Lease, err)
		}
	})

	t.Run("denial-cache", func(t *testing.T) {
		st := newStore(t, srv.Client(t), &redisstore.Options{Prefix: "id:", DenialCache: true})
		lim := limiter(t, st, floodgate.TokenBucket(1, time.Hour, 2))
		waitLive(t, lim)
		if in, err := lim.Inspect(ctx, "k"); err != nil || in.DenialCached {
			t.Fatalf("fresh key: %+v, %v; want no cached denial", in, err)
		}
		if r, err := lim.AllowN(ctx, "k", 2); err != nil || !r.Allowed {
			t.Fatalf("first request: %+v, %v", r, err)
		}
		if r, err := lim.Allow(ctx, "k"); err != nil || r.Allowed || r.Source != floodgate.SourceStore {
			t.Fatalf("denied by Redis: %+v, %v", r, err)
		}
		in, err := lim.Inspect(ctx, "k")
		if err != nil || !in.DenialCached || in.Remaining != 0 || in.Source != floodgate.SourceStore {
			t.Fatalf("after a denial: cached %v, remaining %d, source %s, %v; want a cached denial, Redis's 0 left", in.DenialCached, in.Remaining, in.Source, err)
		}
		if r, err := lim.Allow(ctx, "k"); err != nil || r.Allowed || r.Source != floodgate.SourceCache {
			t.Fatalf("the next request after Inspect: %+v, %v; want the cached denial", r, err)
		}
	})
}
