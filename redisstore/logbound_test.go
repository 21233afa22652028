package redisstore_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/floodgate/floodgate"
	"github.com/floodgate/floodgate/internal/testkit/redistest"
	"github.com/floodgate/floodgate/redisstore"
	"github.com/floodgate/floodgate/storetest"
	"github.com/redis/go-redis/v9"
)

// An override stored before sliding logs were bounded (a limit of 10^6)
// is refused by every decision on its key, with an error that says so,
// without touching the log; it can still be read, listed and deleted.
func TestLogOverrideOverTheBound(t *testing.T) {
	srv := redistest.Start(t)
	client := srv.Client(t)
	ctx := context.Background()
	st := newStore(t, client, &redisstore.Options{Prefix: "b:"})
	lim := limiter(t, st, floodgate.SlidingLog(10, time.Hour))
	if err := client.Set(ctx, "b:{k}:o", "fg1;4,1000000,1000000,86400000000,5", 0).Err(); err != nil {
		t.Fatal(err)
	}
	for _, op := range []func() (floodgate.Result, error){
		func() (floodgate.Result, error) { return lim.AllowN(ctx, "k", 1_000_000) },
		func() (floodgate.Result, error) { return lim.Charge(ctx, "k", 1_000_000) },
		func() (floodgate.Result, error) { return lim.Peek(ctx, "k") },
	} {
		_, err := op()
		if !errors.Is(err, floodgate.ErrStore) || !strings.Contains(err.Error(), "over the maximum") {
			t.Fatalf("a decision on a log override of 10^6: %v, want ErrStore saying it is over the maximum", err)
		}
	}
	if n := client.Exists(ctx, "b:{k}:0l").Val(); n != 0 {
		t.Fatalf("the refused decisions wrote the log")
	}
	// It can be seen, to be replaced.
	if o, ok, err := lim.GetOverride(ctx, "k"); !ok || err != nil || len(o.Limits) != 1 || o.Limits[0].Quota() != 1_000_000 {
		t.Fatalf("GetOverride = %v, %v, %v; want the log of 10^6", o, ok, err)
	}
	listed := 0
	if err := lim.ListOverrides(ctx, func(string, floodgate.Override) bool { listed++; return true }); listed != 1 || err != nil {
		t.Fatalf("ListOverrides listed %d, %v; want 1, nil", listed, err)
	}
	if err := lim.DeleteOverride(ctx, "k", floodgate.ResetUsage); err != nil {
		t.Fatalf("deleting the override: %v", err)
	}
	if r, err := lim.AllowN(ctx, "k", 10); err != nil || !r.Allowed {
		t.Fatalf("after the override's deletion: %+v, %v", r, err)
	}
}

// No request on a sliding log costs Redis more than a bounded amount of
// work, whatever its cost: each of the heaviest requests the limits allow
// (a check, a refund, a charge and a settle of any cost, an override set
// and deleted, a rebase's carry, on logs at MaxLogQuota) runs in about
// half a millisecond of script time, as SLOWLOG measures it. Each is timed
// three times on fresh keys and the quickest counts; the durations are
// logged against the 1ms target, and only a time past guard fails, since
// unbounded work took seconds while a busy 2-core machine's preemption
// alone can pass the target.
func TestLogWorkIsBounded(t *testing.T) {
	const target, guard = time.Millisecond, 20 * time.Millisecond
	L := int64(floodgate.MaxLogQuota)
	day := 24 * time.Hour
	srv := redistest.Start(t)
	client, admin := srv.Client(t), srv.Admin(t)
	ctx := context.Background()
	for _, kv := range [][2]string{{"slowlog-log-slower-than", "0"}, {"slowlog-max-len", "1024"}} {
		if err := admin.ConfigSet(ctx, kv[0], kv[1]).Err(); err != nil {
			t.Fatal(err)
		}
	}
	clock := storetest.NewClock(storetest.Base)
	st := newStore(t, client, &redisstore.Options{Prefix: "w:", Clock: clock})
	opts := &floodgate.Options{Clock: clock}
	newLim := func(limits ...floodgate.Limit) *floodgate.Limiter {
		lim, err := floodgate.NewLimiter(st, limits, opts)
		if err != nil {
			t.Fatal(err)
		}
		return lim
	}
	lim := newLim(floodgate.SlidingLog(L, day))
	must := func(_ floodgate.Result, err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	// full leaves key's log with twice its limit, the most it holds.
	full := func(key string) {
		must(lim.Charge(ctx, key, L))
		must(lim.Charge(ctx, key, L))
	}
	n := 0
	for _, tt := range []struct {
		name string
		prep func(key string) // untimed
		run  func(key string) // timed
	}{
		{"check, expiring twice the limit", func(key string) { full(key); clock.Advance(day) }, func(key string) { must(lim.AllowN(ctx, key, L)) }},
		{"check of cost 10^8 (denied)", nil, func(key string) { must(lim.AllowN(ctx, key, 100_000_000)) }},
		{"refund of 10^8", full, func(key string) { must(lim.Refund(ctx, key, 100_000_000)) }},
		{"charge of 10^8", func(key string) { must(lim.AllowN(ctx, key, L/2)) }, func(key string) { must(lim.Charge(ctx, key, 100_000_000)) }},
		{"settle of 10^8", nil, func(key string) { must(lim.Settle(ctx, key, 0, 100_000_000)) }},
		{"override set", full, func(key string) {
			o := floodgate.Override{Limits: []floodgate.Limit{floodgate.SlidingLog(L, 12*time.Hour)}}
			if err := lim.SetOverride(ctx, key, o, floodgate.AsIs); err != nil {
				t.Fatal(err)
			}
		}},
		{"override deleted", func(key string) {
			o := floodgate.Override{Limits: []floodgate.Limit{floodgate.SlidingLog(L, 12*time.Hour)}}
			if err := lim.SetOverride(ctx, key, o, floodgate.ResetUsage); err != nil {
				t.Fatal(err)
			}
			must(lim.Charge(ctx, key, L))
			must(lim.Charge(ctx, key, L))
		}, func(key string) {
			if err := lim.DeleteOverride(ctx, key, floodgate.Proportional); err != nil {
				t.Fatal(err)
			}
		}},
		{"rebase carry", func(key string) {
			if _, err := lim.Rebase(ctx, key, floodgate.AsIs); err != nil {
				t.Fatal(err)
			}
			full(key + ":a")
		}, func(key string) {
			if n, err := newLim(floodgate.SlidingLog(L, 12*time.Hour)).Rebase(ctx, key, floodgate.AsIs); n != 1 || err != nil {
				t.Fatalf("Rebase = %d, %v; want 1 key carried", n, err)
			}
		}},
	} {
		best := time.Duration(1<<63 - 1)
		var all []time.Duration
		for range 3 {
			n++
			key := fmt.Sprintf("k%d", n)
			if tt.prep != nil {
				tt.prep(key)
			}
			d := scriptTime(t, admin, func() { tt.run(key) })
			all = append(all, d)
			best = min(best, d)
		}
		t.Logf("%s: longest script %v in the quickest of three runs (each run's: %v; target %v)", tt.name, best, all, target)
		if best >= guard {
			t.Errorf("%s: a script ran %v, want well under %v", tt.name, best, guard)
		}
	}
}

// scriptTime runs f and returns the longest that one of floodgate's
// script or function calls took in it, as SLOWLOG (logging every command)
// records it.
func scriptTime(t *testing.T, client *redis.Client, f func()) time.Duration {
	t.Helper()
	ctx := context.Background()
	if err := client.SlowLogReset(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	f()
	logs, err := client.SlowLogGet(ctx, -1).Result()
	if err != nil {
		t.Fatal(err)
	}
	var worst time.Duration
	for _, l := range logs {
		if len(l.Args) == 0 {
			continue
		}
		switch strings.ToLower(l.Args[0]) {
		case "evalsha", "eval", "fcall", "fcall_ro":
			worst = max(worst, l.Duration)
		}
	}
	return worst
}
