package redisstore_test

import (
	"context"
	"fmt"
	"sort"
	"testing"
	"time"

	"github.com/floodgate/floodgate"
	"github.com/floodgate/floodgate/internal/testkit/redistest"
	"github.com/floodgate/floodgate/redisstore"
)

// TestDenialCacheLifts checks that a refund, an override that raises the
// limit and a reset, made through one store, drop the cached denial of
// another store that shares the Redis before the change returns: the other
// store's very next answer comes from Redis, and admits. How long the
// changes take, waiting for that, is logged.
func TestDenialCacheLifts(t *testing.T) {
	srv := redistest.Start(t)
	client := srv.Client(t)
	ctx := context.Background()
	limit := floodgate.TokenBucket(1, time.Hour, 2)
	changes := []struct {
		name   string
		change func(*floodgate.Limiter, string) error
	}{
		{"refund", func(l *floodgate.Limiter, key string) error { _, err := l.Refund(ctx, key, 1); return err }},
		{"override", func(l *floodgate.Limiter, key string) error {
			return l.SetOverride(ctx, key, floodgate.Override{Limits: []floodgate.Limit{floodgate.TokenBucket(1, time.Hour, 10)}}, floodgate.Additive)
		}},
		{"reset", func(l *floodgate.Limiter, key string) error { return l.Reset(ctx, key) }},
	}
	var took []time.Duration // the changes, with the wait for the other store
	for round := range 20 {
		for _, ch := range changes {
			key := fmt.Sprintf("%s-%d", ch.name, round)
			a := newStore(t, client, &redisstore.Options{Prefix: "lift:"})
			b := newStore(t, client, &redisstore.Options{Prefix: "lift:", DenialCache: true})
			la, lb := limiter(t, a, limit), limiter(t, b, limit)
			waitLive(t, lb)
			if r, err := lb.AllowN(ctx, key, 2); err != nil || !r.Allowed {
				t.Fatalf("%s: first request: %+v %v", key, r, err)
			}
			for i := 0; i < 2; i++ {
				r, err := lb.Allow(ctx, key)
				if err != nil || r.Allowed {
					t.Fatalf("%s: request over the limit: %+v %v", key, r, err)
				}
				if i == 1 && r.Source != floodgate.SourceCache {
					t.Fatalf("%s: the second denial did not come from the cache: %+v", key, r)
				}
			}
			start := time.Now()
			if err := ch.change(la, key); err != nil {
				t.Fatalf("%s: %v", key, err)
			}
			took = append(took, time.Since(start))
			// The next request, on the other store, is Redis's.
			r, err := lb.Allow(ctx, key)
			if err != nil || !r.Allowed || r.Source != floodgate.SourceStore {
				t.Fatalf("%s: the other store's next answer: %+v %v; want allowed by Redis", key, r, err)
			}
			a.Close()
			b.Close()
		}
	}
	sort.Slice(took, func(i, j int) bool { return took[i] < took[j] })
	t.Logf("%d changes, each waiting for the other store to drop the key: median %s, max %s", len(took), took[len(took)/2], took[len(took)-1])
}

// waitLive waits until lim's store answers from its denial cache, that is,
// until it is subscribed to the lifts.
func waitLive(t *testing.T, lim *floodgate.Limiter) {
	t.Helper()
	ctx := context.Background()
	key := fmt.Sprintf("live-%p", lim)
	lim.AllowN(ctx, key, lim.Limits()[0].Quota())
	for start := time.Now(); time.Since(start) < 5*time.Second; {
		if r, _ := lim.Allow(ctx, key); r.Source == floodgate.SourceCache {
			return
		}
	}
	t.Fatal("the denial cache never answered")
}
