package redisstore_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/floodgate/floodgate"
	"github.com/floodgate/floodgate/internal/testkit/redistest"
	"github.com/floodgate/floodgate/redisstore"
	"github.com/floodgate/floodgate/storetest"
	"github.com/redis/go-redis/v9"
)

// Leases on a fixed clock, step by step: a cold key goes to Redis, a hot
// one takes a lease with its request, the lease admits locally with the
// answers Redis would give, a used-up lease is followed by the next, a
// reset in another process ends it, and Close gives back what is left.
func TestLeaseSteps(t *testing.T) {
	srv := redistest.Start(t)
	clock := storetest.NewClock(storetest.Base)
	opts := &redisstore.Options{Prefix: "l:", Clock: clock, Leases: &redisstore.LeaseOptions{Share: 0.1, Time: 100 * time.Millisecond}}
	a := newStore(t, srv.Client(t), opts)
	b := newStore(t, srv.Client(t), &redisstore.Options{Prefix: "l:", Clock: clock})
	limit := floodgate.TokenBucket(100, time.Second, 1000) // a lease: min(10% of 1000, 100ms of 100/s) = 10 units
	la, lb := limiter(t, a, limit), limiter(t, b, limit)
	ctx := context.Background()
	type want struct {
		source    floodgate.Source
		remaining int64
	}
	step := func(i int, w want) {
		t.Helper()
		r, err := la.Allow(ctx, "k")
		if err != nil || !r.Allowed || r.Source != w.source || r.Remaining != w.remaining {
			t.Fatalf("decision %d = %+v, %v; want allowed from %s with %d left", i, r, err, w.source, w.remaining)
		}
		// T = 10ms: the reset is exactly the units used.
		if r.ResetAfter != time.Duration(1000-r.Remaining)*10*time.Millisecond {
			t.Fatalf("decision %d: reset %s with %d left", i, r.ResetAfter, r.Remaining)
		}
	}
	for i := 1; i <= 8; i++ {
		step(i, want{floodgate.SourceStore, 1000 - int64(i)}) // cold: Redis, counted
	}
	step(9, want{floodgate.SourceStore, 991}) // hot: Redis, with a lease of 10 (Redis has 981)
	for i := 10; i <= 19; i++ {
		step(i, want{floodgate.SourceLease, 1000 - int64(i)})
	}
	step(20, want{floodgate.SourceStore, 980}) // used up: the next lease
	if r, err := lb.Peek(ctx, "k"); err != nil || r.Remaining != 970 {
		t.Fatalf("Redis's own count = %+v, %v; want 970 (980 less the lease's 10)", r, err)
	}
	step(21, want{floodgate.SourceLease, 979})

	// The lease's time is up: what is left goes back, and the key, which
	// had a lease, takes a new one with its next request.
	clock.Advance(100 * time.Millisecond) // 10 units restored
	step(22, want{floodgate.SourceStore, 988})
	if r, err := lb.Peek(ctx, "k"); err != nil || r.Remaining != 978 {
		t.Fatalf("Redis after the ended lease's 9 came back and a new one was taken = %+v, %v; want 978", r, err)
	}

	// A reset in another process ends the lease: the next request is
	// Redis's, on a full key.
	if err := lb.Reset(ctx, "k"); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the lease to end", func() bool {
		r, err := lb.Peek(ctx, "k")
		return err == nil && r.Remaining == 1000
	})
	r, err := la.Allow(ctx, "k")
	if err != nil || r.Source == floodgate.SourceLease || r.Remaining > 999 {
		t.Fatalf("after a reset elsewhere = %+v, %v; want Redis's answer", r, err)
	}

	// Close gives back what the lease has left. The decision above
	// started a new window (a lease's time had passed since the last one
	// started), so the key is hot again at its ninth decision.
	left := r.Remaining
	for i := 2; i <= 9; i++ {
		left--
		step(22+i, want{floodgate.SourceStore, left})
	}
	step(32, want{floodgate.SourceLease, left - 1})
	before, _ := lb.Peek(ctx, "k")
	a.Close()
	after, err := lb.Peek(ctx, "k")
	if err != nil || after.Remaining <= before.Remaining {
		t.Fatalf("after Close: %d left, before %d; want the lease's units back", after.Remaining, before.Remaining)
	}
}

// Several stores on one Redis, each with leases and 16 goroutines on one
// hot key: none admits a unit that the shared limit did not give, and
// Redis sees a small fraction of the decisions.
func TestLeasesNeverOverAdmit(t *testing.T) {
	srv := redistest.Start(t)
	client := srv.Client(t)
	ctx := context.Background()
	const rate, burst = 20000, 2000 // leases of min(20, 200) = 20 units
	limit := floodgate.TokenBucket(rate, time.Second, burst)
	var lims []*floodgate.Limiter
	for range 3 {
		st := newStore(t, srv.Client(t), &redisstore.Options{Leases: &redisstore.LeaseOptions{}})
		lims = append(lims, limiter(t, st, limit))
	}
	client.ConfigResetStat(ctx)
	start, _ := client.Time(ctx).Result()
	stop := time.Now().Add(time.Second)
	var admitted, decisions, leased atomic.Int64
	var wg sync.WaitGroup
	for _, lim := range lims {
		for range 16 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for time.Now().Before(stop) {
					r, err := lim.Allow(ctx, "hot")
					if err != nil {
						t.Error(err)
						return
					}
					decisions.Add(1)
					if r.Allowed {
						admitted.Add(1)
					}
					if r.Source == floodgate.SourceLease {
						leased.Add(1)
					}
				}
			}()
		}
	}
	wg.Wait()
	end, _ := client.Time(ctx).Result()
	_, calls := scriptStats(t, client)
	bound := burst + rate*end.Sub(start).Seconds()
	t.Logf("%d decisions, %d admitted (%d from leases), bound %.0f; %.0f script calls (%.3f per decision)",
		decisions.Load(), admitted.Load(), leased.Load(), bound, calls, calls/float64(decisions.Load()))
	if float64(admitted.Load()) > bound {
		t.Fatalf("admitted %d, more than the shared limit's %.0f", admitted.Load(), bound)
	}
	if leased.Load() == 0 {
		t.Fatal("no decision came from a lease")
	}
}

// waitFor polls cond every millisecond, for at most 5s.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(time.Millisecond) {
		if cond() {
			return
		}
	}
	t.Fatalf("timed out waiting for %s", what)
}

// Leases on more keys than a script call of give-backs carries, standalone
// and on a Cluster, where the give-backs of one call go per slot: when
// the leases end (Close here, a sweep alike), every unit comes back to
// its own key.
func TestLeasesGiveBackMany(t *testing.T) {
	clients := map[string]func(t *testing.T) redis.UniversalClient{
		"standalone": func(t *testing.T) redis.UniversalClient { return redistest.Start(t).Client(t) },
		"cluster":    func(t *testing.T) redis.UniversalClient { return redistest.StartCluster(t, 3).Client(t) },
	}
	for name, newClient := range clients {
		t.Run(name, func(t *testing.T) {
			client := newClient(t)
			clock := storetest.NewClock(storetest.Base)
			a := newStore(t, client, &redisstore.Options{Clock: clock, Leases: &redisstore.LeaseOptions{Share: 0.01, Time: time.Hour}})
			b := newStore(t, client, &redisstore.Options{Clock: clock})
			limit := floodgate.TokenBucket(100, time.Second, 1000) // leases of 10 units
			la, lb := limiter(t, a, limit), limiter(t, b, limit)
			ctx := context.Background()
			const keys = 300 // more than two script calls of give-backs
			for i := range keys {
				k := fmt.Sprintf("k%d", i)
				for j := range 10 { // eight cold, hot with a lease, from the lease
					if r, err := la.Allow(ctx, k); err != nil || !r.Allowed {
						t.Fatalf("%s, decision %d = %+v, %v", k, j+1, r, err)
					}
				}
				if r, err := lb.Peek(ctx, k); err != nil || r.Remaining != 1000-9-10 {
					t.Fatalf("%s in Redis with its lease out = %+v, %v; want %d", k, r, err, 1000-9-10)
				}
			}
			a.Close()
			for i := range keys {
				k := fmt.Sprintf("k%d", i)
				if r, err := lb.Peek(ctx, k); err != nil || r.Remaining != 1000-10 {
					t.Fatalf("%s in Redis after Close = %+v, %v; want %d: the 9 units its lease had left back", k, r, err, 1000-10)
				}
			}
		})
	}
}
