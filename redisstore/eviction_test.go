package redisstore_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/floodgate/floodgate"
	"github.com/floodgate/floodgate/fallback"
	"github.com/floodgate/floodgate/internal/testkit/redistest"
	"github.com/floodgate/floodgate/redisstore"
	"github.com/redis/go-redis/v9"
)

// TestEvictionPolicies measures, for each maxmemory-policy, what a Redis
// short of memory does to floodgate's limits: a hot key, checked every
// 2ms against 100 per 10s with bursts of 100, and an idle key whose daily
// limit of 5 was used up before the run, while other keys (per second,
// per hour and per day, as other rules' keys would be) flood a
// redis-server with maxmemory 2mb. It prints a table of admissions
// against the exact count (a memory store fed the same requests) and the
// errors. It is a measurement, not a check: it runs only with
// FLOODGATE_EVICTION_TABLE=1. $FLOODGATE_EVICTION_SECONDS is the seconds
// per policy (default 2), $FLOODGATE_EVICTION_REPEAT how many checks each
// flood key gets (default 1: keys of one request, as a scan makes),
// $FLOODGATE_EVICTION_POLICIES a comma-separated list of the policies.
func TestEvictionPolicies(t *testing.T) {
	if os.Getenv("FLOODGATE_EVICTION_TABLE") != "1" {
		t.Skip("a measurement: set FLOODGATE_EVICTION_TABLE=1 to run it")
	}
	secs := 2.0
	if s := os.Getenv("FLOODGATE_EVICTION_SECONDS"); s != "" {
		secs, _ = strconv.ParseFloat(s, 64)
	}
	run := time.Duration(secs * float64(time.Second))
	repeat := 1
	if s := os.Getenv("FLOODGATE_EVICTION_REPEAT"); s != "" {
		repeat, _ = strconv.Atoi(s)
		repeat = max(repeat, 1)
	}
	policies := []string{"noeviction", "allkeys-lru", "allkeys-lfu", "allkeys-random", "volatile-lru", "volatile-lfu", "volatile-ttl", "volatile-random"}
	if s := os.Getenv("FLOODGATE_EVICTION_POLICIES"); s != "" {
		policies = strings.Split(s, ",")
	}
	var rows []string
	for _, p := range policies {
		for _, withFallback := range []bool{false, true} {
			if withFallback && p != "noeviction" {
				continue // the fallback answers only on errors: the same as without
			}
			r := measureEviction(t, p, run, repeat, withFallback)
			name := p
			if withFallback {
				name += " +fallback"
			}
			rows = append(rows, fmt.Sprintf("| %-26s | %5d | %5d | %4d | %4d | %4d | %7d | %7d | %7d |",
				name, r.hotAdmitted, r.hotExact, r.hotErrors, r.idleAdmitted, r.idleErrors, r.floodOps, r.floodErrors, r.evicted))
		}
	}
	t.Logf("\n| policy                     | hot admitted | exact | hot errors | idle admitted (exact 0) | idle errors | flood checks | flood errors | evicted_keys |\n%s", strings.Join(rows, "\n"))
}

type evictionResult struct {
	hotAdmitted, hotExact, hotErrors int
	idleAdmitted, idleErrors         int
	floodOps, floodErrors            int64
	evicted                          int64
}

func measureEviction(t *testing.T, policy string, run time.Duration, repeat int, withFallback bool) evictionResult {
	srv := redistest.Start(t, "--maxmemory", "2mb", "--maxmemory-policy", policy)
	client := redis.NewClient(&redis.Options{Addr: srv.Addr, ContextTimeoutEnabled: true})
	defer client.Close()
	rs := redisstore.New(client, nil)
	defer rs.Close()
	var store floodgate.Store = rs
	if withFallback {
		fb := fallback.New(rs, &fallback.Options{Mode: fallback.Local, Budget: 200 * time.Millisecond})
		defer fb.Close()
		store = fb
	}
	mem := floodgate.NewMemoryStore(nil)
	defer mem.Close()
	ctx := context.Background()
	mk := func(st floodgate.Store, l floodgate.Limit) *floodgate.Limiter {
		lim, err := floodgate.NewLimiter(st, []floodgate.Limit{l}, nil)
		if err != nil {
			t.Fatal(err)
		}
		return lim
	}
	hotLimit := floodgate.TokenBucket(100, 10*time.Second, 100)
	idleLimit := floodgate.FixedWindow(5, 24*time.Hour)
	hot, hotRef := mk(store, hotLimit), mk(mem, hotLimit)
	idle := mk(store, idleLimit)
	var r evictionResult
	for range 6 { // the idle key: its day's 5 used up, then left alone
		if _, err := idle.Allow(ctx, "idle"); err != nil {
			t.Fatal(err)
		}
	}
	floods := []*floodgate.Limiter{mk(store, floodgate.PerSecond(5)), mk(store, floodgate.PerHour(100)), mk(store, floodgate.FixedWindow(1000, 24*time.Hour))}
	pad := strings.Repeat("x", 48) // keys of the size of a user id or an IP and a path
	var stop atomic.Bool
	var wg sync.WaitGroup
	var ops, errs atomic.Int64
	for g := range 6 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; !stop.Load(); i++ {
				k := i / repeat
				_, err := floods[k%len(floods)].Allow(ctx, fmt.Sprintf("flood:%d:%d:%s", g, k, pad))
				ops.Add(1)
				if err != nil {
					errs.Add(1)
				}
			}
		}()
	}
	tick := time.NewTicker(2 * time.Millisecond)
	for end := time.Now().Add(run); time.Now().Before(end); <-tick.C {
		res, err := hot.Allow(ctx, "hot")
		ref, _ := hotRef.Allow(ctx, "hot")
		switch {
		case err != nil:
			r.hotErrors++
		case res.Allowed:
			r.hotAdmitted++
		}
		if ref.Allowed {
			r.hotExact++
		}
	}
	tick.Stop()
	stop.Store(true)
	wg.Wait()
	for range 10 {
		res, err := idle.Allow(ctx, "idle")
		switch {
		case err != nil:
			r.idleErrors++
		case res.Allowed:
			r.idleAdmitted++
		}
	}
	r.floodOps, r.floodErrors = ops.Load(), errs.Load()
	info, err := client.Info(ctx, "stats").Result()
	if err == nil {
		for _, line := range strings.Split(info, "\r\n") {
			if v, ok := strings.CutPrefix(line, "evicted_keys:"); ok {
				r.evicted, _ = strconv.ParseInt(v, 10, 64)
			}
		}
	} else if !errors.Is(err, context.Canceled) {
		t.Log(err)
	}
	srv.Stop()
	return r
}
