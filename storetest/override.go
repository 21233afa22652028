package storetest

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	fg "github.com/floodgate/floodgate"
)

// OverrideScenarios returns the scenarios of per-key overrides and of the
// four strategies that carry a key's usage to its new limits. Like
// Scenarios, every expected value was worked out by hand. The first four
// are bucket4j's documented example: a capacity of 100 with 40 left,
// raised to 200, leaves 140, 40, 80 or 200.
func OverrideScenarios() []Scenario {
	hour := fg.TokenBucket(100, hr, 100)   // T = 36s, τ = 3600s
	double := fg.TokenBucket(100, hr, 200) // T = 36s, τ = 7200s
	premium := double.Named("premium")     //
	half := fg.TokenBucket(50, hr, 50)     // T = 72s, τ = 3600s
	ov := func(r fg.Result) fg.Result { r.Overridden = true; return r }
	take60 := Step{N: 60, Want: ok(100, 40, 36*minute)} // TAT 2160s
	bucket4j := func(st fg.Strategy, want fg.Result) Scenario {
		return Scenario{
			Name:   "override/bucket4j-" + st.String(),
			Limits: []fg.Limit{hour},
			Steps: []Step{
				take60,
				{Op: Override, Limits: []fg.Limit{premium}, Strategy: st},
				{N: 0, Want: ov(want)},
				{N: 1, Want: ov(fg.Result{Allowed: true, Quota: 200, Remaining: want.Remaining - 1, ResetAfter: want.ResetAfter + 36*sec})},
			},
		}
	}
	return []Scenario{
		{
			// What time does not explain lifts a denial at once, also in
			// a store that caches denials: a refund, a reset, a raise.
			Name:   "override/lifts-denials",
			Limits: []fg.Limit{fg.TokenBucket(1, minute, 2)}, // T = 60s, τ = 120s
			Steps: []Step{
				{At: 0, N: 2, Want: ok(2, 0, 2*minute)},
				{At: 0, N: 1, Want: no(2, 0, minute, 2*minute)},
				{At: sec, Op: Refund, N: 1, Want: ok(2, 1, 59*sec)},
				{At: sec, N: 1, Want: ok(2, 0, 119*sec)},
				{At: 2 * sec, N: 1, Want: no(2, 0, 58*sec, 118*sec)},
				{At: 2 * sec, Op: Reset},
				{At: 2 * sec, N: 2, Want: ok(2, 0, 2*minute)},
				{At: 2 * sec, N: 1, Want: no(2, 0, minute, 2*minute)},
				{At: 2 * sec, Op: Override, Limits: []fg.Limit{fg.TokenBucket(1, minute, 4)}, Strategy: fg.Additive},
				{At: 2 * sec, N: 1, Want: ov(ok(4, 1, 3*minute))},
				{At: 2 * sec, N: 2, Want: ov(no(4, 1, minute, 3*minute))},
			},
		},
		bucket4j(fg.Additive, ok(200, 140, 36*minute)),    // TAT kept
		bucket4j(fg.AsIs, ok(200, 40, 96*minute)),         // 100 charged: TAT 5760s
		bucket4j(fg.Proportional, ok(200, 80, 72*minute)), // 60 charged: TAT 4320s
		bucket4j(fg.ResetUsage, ok(200, 200, 0)),
		{
			// Back from 79 of 200 to 100, proportionally: 39. The TAT (4356s)
			// is 20 units beyond the bucket, which reads as 0 left: the
			// first refund of 39 leaves 18, the second of 21 leaves 39.
			Name:   "override/delete-proportional-from-debt",
			Limits: []fg.Limit{hour},
			Steps: []Step{
				take60,
				{Op: Override, Limits: []fg.Limit{double}, Strategy: fg.Proportional},
				{N: 1, Want: ov(ok(200, 79, 72*minute+36*sec))},
				{Op: Override, Strategy: fg.Proportional},
				{N: 0, Want: ok(100, 39, 2196*sec)},
			},
		},
		{
			// A faster rate: the TAT, 5h ahead, reads as a debt of hours at
			// T = 36s. The refund of 45 falls short, so the limit starts
			// afresh and is charged the 5 used: 45 left, full in 180s.
			Name:   "override/faster-rate-additive",
			Limits: []fg.Limit{fg.TokenBucket(1, hr, 5)},
			Steps: []Step{
				{N: 5, Want: ok(5, 0, 5*hr)},
				{Op: Override, Limits: []fg.Limit{fg.TokenBucket(100, hr, 50)}},
				{N: 0, Want: ov(ok(50, 45, 3*minute))},
				{Op: Override, Strategy: fg.AsIs},
				{N: 0, Want: ok(5, 5, 0)},
			},
		},
		{
			// Lowered to 50 (T = 72s): the TAT of 1080s reads as 35 left.
			// Additive keeps 70 up to the new quota: full.
			Name:   "override/lower-additive",
			Limits: []fg.Limit{hour},
			Steps: []Step{
				{N: 30, Want: ok(100, 70, 18*minute)},
				{Op: Override, Limits: []fg.Limit{half}, Strategy: fg.Additive},
				{N: 0, Want: ov(ok(50, 50, 0))},
			},
		},
		{
			// Proportional keeps 35 of 50, which the TAT already says.
			Name:   "override/lower-proportional",
			Limits: []fg.Limit{hour},
			Steps: []Step{
				{N: 30, Want: ok(100, 70, 18*minute)},
				{Op: Override, Limits: []fg.Limit{half}, Strategy: fg.Proportional},
				{N: 0, Want: ov(ok(50, 35, 18*minute))},
			},
		},
		{
			Name:   "override/fixed-window",
			Limits: []fg.Limit{fg.FixedWindow(100, hr)},
			Steps: []Step{
				{Key: "a", N: 60, Want: ok(100, 40, hr)},
				{Key: "a", Op: Override, Limits: []fg.Limit{fg.FixedWindow(200, hr)}},
				{Key: "a", N: 0, Want: ov(ok(200, 140, hr))},
				{Key: "b", N: 60, Want: ok(100, 40, hr)},
				{Key: "b", Op: Override, Limits: []fg.Limit{fg.FixedWindow(200, hr)}, Strategy: fg.AsIs},
				{Key: "b", N: 0, Want: ov(ok(200, 40, hr))},
				{Key: "c", N: 60, Want: ok(100, 40, hr)},
				{Key: "c", Op: Override, Limits: []fg.Limit{fg.FixedWindow(200, hr)}, Strategy: fg.Proportional},
				{Key: "c", N: 0, Want: ov(ok(200, 80, hr))},
				{Key: "c", At: hr, N: 0, Want: ov(ok(200, 200, 0))},
			},
		},
		{
			Name:   "override/sliding-log",
			Limits: []fg.Limit{fg.SlidingLog(100, hr)},
			Steps: []Step{
				{Key: "a", N: 60, Want: ok(100, 40, hr)},
				{Key: "a", Op: Override, Limits: []fg.Limit{fg.SlidingLog(200, hr)}, Strategy: fg.Proportional},
				{Key: "a", N: 0, Want: ov(ok(200, 80, hr))},
				{Key: "a", Op: Override, Strategy: fg.Additive},
				{Key: "a", N: 0, Want: ok(100, 80, hr)},
				{Key: "b", N: 60, Want: ok(100, 40, hr)},
				{Key: "b", Op: Override, Limits: []fg.Limit{fg.SlidingLog(200, hr)}, Strategy: fg.AsIs},
				{Key: "b", N: 0, Want: ov(ok(200, 40, hr))},
			},
		},
		{
			// The counter's reset is two windows after its current one
			// starts.
			Name:   "override/sliding-window",
			Limits: []fg.Limit{fg.SlidingWindow(100, hr)},
			Steps: []Step{
				{N: 60, Want: ok(100, 40, 2*hr)},
				{Op: Override, Limits: []fg.Limit{fg.SlidingWindow(200, hr)}, Strategy: fg.AsIs},
				{N: 0, Want: ov(ok(200, 40, 2*hr))},
				{Op: Override, Limits: []fg.Limit{fg.SlidingWindow(200, hr)}, Strategy: fg.ResetUsage},
				{N: 0, Want: ov(ok(200, 200, 0))},
			},
		},
		{
			// Another algorithm: its state starts afresh and is charged to
			// what the strategy keeps (4 of 10, proportionally).
			Name:   "override/other-algorithm",
			Limits: []fg.Limit{hour},
			Steps: []Step{
				take60,
				{Op: Override, Limits: []fg.Limit{fg.FixedWindow(10, minute)}, Strategy: fg.Proportional},
				{N: 0, Want: ov(ok(10, 4, minute))},
				{N: 5, Want: ov(no(10, 4, minute, minute))},
			},
		},
		{
			// A second limit that the old limits did not have starts full;
			// the result describes the one with fewer left.
			Name:   "override/more-limits",
			Limits: []fg.Limit{hour},
			Steps: []Step{
				take60,
				{Op: Override, Limits: []fg.Limit{premium, fg.FixedWindow(1000, 24*hr).Named("daily")}},
				{N: 0, Want: ov(ok(200, 140, 36*minute))},
				{N: 139, Want: ov(ok(200, 1, 36*minute+139*36*sec))},
				{N: 2, Want: ov(no(200, 1, 36*sec, 36*minute+139*36*sec))},
			},
		},
		{
			// When the override expires the key's state is read under the
			// Limiter's limits: the TAT of 2160s, a minute later, leaves 41.
			Name:   "override/expires",
			Limits: []fg.Limit{hour},
			Steps: []Step{
				take60,
				{Op: Override, Limits: []fg.Limit{double}, TTL: minute},
				{At: minute - ms, N: 0, Want: ov(ok(200, 141, 36*minute-minute+ms))},
				{At: minute, N: 0, Want: ok(100, 41, 35*minute)},
			},
		},
		{
			// An override belongs to its key: others keep the Limiter's
			// limits, and a Reset empties the key under its override.
			Name:   "override/key-isolation-and-reset",
			Limits: []fg.Limit{hour},
			Steps: []Step{
				{Op: Override, Limits: []fg.Limit{double}},
				{N: 150, Want: ov(ok(200, 50, 90*minute))},
				{Key: "other", N: 150, Want: no(100, 100, fg.Never, 0)},
				{Op: Reset},
				{N: 0, Want: ov(ok(200, 200, 0))},
			},
		},
	}
}

// runOverrideAPI checks reading, listing and the errors of overrides, and
// that a failed change changes nothing.
func runOverrideAPI(t *testing.T, newStore NewStore) {
	clock := NewClock(Base)
	st := newStore(t, clock)
	t.Cleanup(func() { st.Close() })
	ctx := context.Background()
	lim, err := fg.NewLimiter(st, []fg.Limit{fg.PerMinute(10)}, &fg.Options{Clock: clock})
	if err != nil {
		t.Fatal(err)
	}
	if _, ok, err := lim.GetOverride(ctx, "k"); ok || err != nil {
		t.Fatalf("GetOverride before any = %v, %v; want false, nil", ok, err)
	}
	want := []fg.Limit{fg.GCRA(4, 10, time.Second).Named("fast"), fg.SlidingLog(200, time.Hour)}
	if err := lim.SetOverride(ctx, "k", fg.Override{Limits: want, TTL: 1500 * ms}, fg.Additive); err != nil {
		t.Fatalf("SetOverride: %v", err)
	}
	check := func(ttl time.Duration) {
		t.Helper()
		got, ok, err := lim.GetOverride(ctx, "k")
		if !ok || err != nil {
			t.Fatalf("GetOverride = %v, %v; want true, nil", ok, err)
		}
		if got.TTL != ttl || len(got.Limits) != len(want) {
			t.Fatalf("GetOverride = %v with TTL %s; want %v with TTL %s", got.Limits, got.TTL, want, ttl)
		}
		for i := range want {
			if got.Limits[i].String() != want[i].String() {
				t.Fatalf("GetOverride limit %d = %s, want %s", i, got.Limits[i], want[i])
			}
		}
	}
	check(1500 * ms)
	clock.Advance(500 * ms)
	check(1000 * ms)

	// Another Limiter of the store sees the key's override.
	other, err := fg.NewLimiter(st, []fg.Limit{fg.PerSecond(1)}, &fg.Options{Clock: clock})
	if err != nil {
		t.Fatal(err)
	}
	if r, err := other.Peek(ctx, "k"); err != nil || !r.Overridden || r.Quota != 5 || r.Name != "fast" {
		t.Fatalf("other Limiter's Peek = %+v, %v; want the override's 5 named fast", r, err)
	}

	if err := lim.SetOverride(ctx, "j", fg.Override{Limits: []fg.Limit{fg.PerSecond(3)}}, fg.AsIs); err != nil {
		t.Fatal(err)
	}
	seen := map[string]int{}
	if err := lim.ListOverrides(ctx, func(key string, o fg.Override) bool {
		seen[key] = len(o.Limits)
		return true
	}); err != nil {
		t.Fatalf("ListOverrides: %v", err)
	}
	if len(seen) != 2 || seen["k"] != 2 || seen["j"] != 1 {
		t.Fatalf("ListOverrides saw %v, want k with 2 limits and j with 1", seen)
	}

	bad := []struct {
		name string
		key  string
		o    fg.Override
		st   fg.Strategy
		want error
	}{
		{"empty key", "", fg.Override{Limits: want}, 0, fg.ErrInvalidKey},
		{"key too long", strings.Repeat("x", fg.MaxKeyLen+1), fg.Override{Limits: want}, 0, fg.ErrInvalidKey},
		{"no limits", "k", fg.Override{}, 0, fg.ErrNoLimits},
		{"invalid limit", "k", fg.Override{Limits: []fg.Limit{fg.TokenBucket(0, sec, 1)}}, 0, fg.ErrInvalidLimit},
		{"calendar window", "k", fg.Override{Limits: []fg.Limit{fg.CalendarWindow(5, fg.Day, nil)}}, 0, fg.ErrInvalidLimit},
		{"negative TTL", "k", fg.Override{Limits: want, TTL: -sec}, 0, fg.ErrInvalidLimit},
		{"sub-millisecond TTL", "k", fg.Override{Limits: want, TTL: 1500 * us}, 0, fg.ErrInvalidLimit},
		{"unknown strategy", "k", fg.Override{Limits: want}, 9, fg.ErrInvalidLimit},
	}
	for _, tt := range bad {
		if err := lim.SetOverride(ctx, tt.key, tt.o, tt.st); !errors.Is(err, tt.want) {
			t.Errorf("SetOverride with %s: error %v, want %v", tt.name, err, tt.want)
		}
	}
	check(1000 * ms) // unchanged by the failures

	if err := lim.DeleteOverride(ctx, "k", fg.Additive); err != nil {
		t.Fatalf("DeleteOverride: %v", err)
	}
	if _, ok, _ := lim.GetOverride(ctx, "k"); ok {
		t.Fatal("GetOverride after DeleteOverride found one")
	}
	clock.Advance(2 * sec)
	if r, err := lim.Peek(ctx, "k"); err != nil || r.Overridden {
		t.Fatalf("Peek after DeleteOverride = %+v, %v; want the Limiter's limits", r, err)
	}
}

// supportsOverrides reports whether the stores of newStore keep overrides.
func supportsOverrides(t *testing.T, newStore NewStore) bool {
	st := newStore(t, NewClock(Base))
	defer st.Close()
	lim, err := fg.NewLimiter(st, []fg.Limit{fg.PerSecond(1)}, nil)
	if err != nil {
		t.Fatal(err)
	}
	_, _, err = lim.GetOverride(context.Background(), "k")
	return !errors.Is(err, errors.ErrUnsupported)
}
