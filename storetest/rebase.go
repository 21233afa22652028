package storetest

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/floodgate/floodgate"
)

// rebaseCase is a Limiter replaced by another with new limits on the same
// keys (a reloaded rule): 60 of the old limit's 100 are used, and Rebase
// carries what is left to the new limit's 200 as bucket4j's strategies
// say, for each algorithm's equivalent.
type rebaseCase struct {
	name     string
	old, new floodgate.Limit
}

func rebaseCases() []rebaseCase {
	return []rebaseCase{
		{"token-bucket", floodgate.TokenBucket(100, time.Minute, 100), floodgate.TokenBucket(200, time.Minute, 200)},
		// Only the burst changes: the refill rate stays at 1 per second.
		{"token-bucket-burst", floodgate.TokenBucket(60, time.Minute, 100), floodgate.TokenBucket(60, time.Minute, 200)},
		{"fixed-window", floodgate.FixedWindow(100, time.Minute), floodgate.FixedWindow(200, time.Minute)},
		{"sliding-window", floodgate.SlidingWindow(100, time.Minute), floodgate.SlidingWindow(200, time.Minute)},
		{"sliding-log", floodgate.SlidingLog(100, time.Minute), floodgate.SlidingLog(200, time.Minute)},
		{"leaky-bucket", floodgate.LeakyBucket(100, 100, time.Minute), floodgate.LeakyBucket(200, 200, time.Minute)},
		{"gcra", floodgate.GCRA(99, 100, time.Minute), floodgate.GCRA(199, 200, time.Minute)},
		// Another algorithm starts afresh, then keeps what the strategy
		// says of the old limit's 40 left.
		{"window-to-bucket", floodgate.FixedWindow(100, time.Minute), floodgate.TokenBucket(200, time.Minute, 200)},
	}
}

// runRebase checks Limiter.Rebase: the four strategies on every
// algorithm, keys outside the scope and overridden keys left alone, each
// key carried once however often Rebase is called, and going back; and
// calendar windows, which Rebase leaves alone (see runRebaseCalendar).
func runRebase(t *testing.T, newStore NewStore) {
	want := map[floodgate.Strategy]int64{floodgate.Proportional: 80, floodgate.AsIs: 40, floodgate.Additive: 140, floodgate.ResetUsage: 200}
	for _, tc := range rebaseCases() {
		for _, strategy := range strategies {
			t.Run(tc.name+"/"+strategy.String(), func(t *testing.T) {
				t.Parallel()
				clock, st, old := startRebase(t, newStore, tc.old, strategy)
				ctx := context.Background()
				opts := &floodgate.Options{Clock: clock}
				for _, key := range []string{"r:a", "r:b", "s:a"} {
					if r, err := old.AllowN(ctx, key, 60); !r.Allowed || err != nil {
						t.Fatalf("AllowN(%s, 60) = %+v, %v", key, r, err)
					}
				}
				// r:b has its own limit, which Rebase leaves alone.
				if err := old.SetOverride(ctx, "r:b", floodgate.Override{Limits: []floodgate.Limit{floodgate.FixedWindow(1000, time.Hour)}}, floodgate.Additive); err != nil {
					t.Fatal(err)
				}
				repl, err := floodgate.NewLimiter(st, []floodgate.Limit{tc.new}, opts)
				if err != nil {
					t.Fatal(err)
				}
				outside, err := repl.Peek(ctx, "s:a")
				if err != nil {
					t.Fatal(err)
				}
				if n, err := repl.Rebase(ctx, "r:", strategy); n != 1 || err != nil {
					t.Fatalf("Rebase = %d, %v; want 1 key carried (r:a), nil", n, err)
				}
				peek := func(key string) floodgate.Result {
					t.Helper()
					r, err := repl.Peek(ctx, key)
					if err != nil {
						t.Fatal(err)
					}
					return r
				}
				if r := peek("r:a"); r.Remaining != want[strategy] || r.Quota != 200 {
					t.Fatalf("after Rebase r:a has %d of %d left, want %d of 200", r.Remaining, r.Quota, want[strategy])
				}
				if r := peek("r:b"); !r.Overridden || r.Remaining != 940 {
					t.Fatalf("the overridden r:b = %+v, want its override's 940 left", r)
				}
				if r := peek("s:a"); r.Remaining != outside.Remaining {
					t.Fatalf("s:a, outside the scope, has %d left after Rebase, %d before", r.Remaining, outside.Remaining)
				}
				// Again, from this process or another: nothing is carried twice.
				if n, err := repl.Rebase(ctx, "r:", strategy); n != 0 || err != nil {
					t.Fatalf("second Rebase = %d, %v; want 0, nil", n, err)
				}
				if r := peek("r:a"); r.Remaining != want[strategy] {
					t.Fatalf("after a second Rebase r:a has %d left, want %d still", r.Remaining, want[strategy])
				}
				// Back to the old limits, as-is: whatever is left, within 100.
				// A reset key is full, which the store does not hold.
				held := 1
				if strategy == floodgate.ResetUsage {
					held = 0
				}
				if n, err := old.Rebase(ctx, "r:", floodgate.AsIs); n != held || err != nil {
					t.Fatalf("Rebase back = %d, %v; want %d, nil", n, err, held)
				}
				if r, err := old.Peek(ctx, "r:a"); err != nil || r.Remaining != min(want[strategy], 100) {
					t.Fatalf("back on the old limits r:a = %+v, %v; want %d left", r, err, min(want[strategy], 100))
				}
			})
		}
	}
	t.Run("calendar", func(t *testing.T) { runRebaseCalendar(t, newStore) })
	t.Run("errors", func(t *testing.T) {
		st := newStore(t, NewClock(Base))
		t.Cleanup(func() { st.Close() })
		lim, err := floodgate.NewLimiter(st, []floodgate.Limit{floodgate.PerSecond(1)}, nil)
		if err != nil {
			t.Fatal(err)
		}
		ctx := context.Background()
		if _, err := lim.Rebase(ctx, "", floodgate.Additive); !errors.Is(err, floodgate.ErrInvalidKey) {
			t.Errorf("Rebase of an empty scope: %v, want ErrInvalidKey", err)
		}
		if _, err := lim.Rebase(ctx, "r:", floodgate.Strategy(9)); !errors.Is(err, floodgate.ErrInvalidLimit) {
			t.Errorf("Rebase with an unknown strategy: %v, want ErrInvalidLimit", err)
		}
	})
}

// runRebaseCalendar checks Rebase when the old or the new limits have a
// calendar window, which keeps its count: Rebase records the new limits,
// carries nothing and fails nothing, whatever the strategy, and a key
// reads its state under the new limits as it stands (60 of the old
// limit's 100 used).
func runRebaseCalendar(t *testing.T, newStore NewStore) {
	// A zone an hour east of UTC, so that the day does not start at
	// Base's midnight UTC.
	zone := time.FixedZone("UTC+1", 3600)
	tests := []struct {
		name     string
		old, new floodgate.Limit
		left     int64 // r:a's remaining of 200 under the new limits
	}{
		{"calendar-day", floodgate.CalendarWindow(100, floodgate.Day, zone), floodgate.CalendarWindow(200, floodgate.Day, zone), 140},
		{"calendar-week", floodgate.CalendarWindow(100, floodgate.Week, nil), floodgate.CalendarWindow(200, floodgate.Week, nil), 140},
		{"calendar-month", floodgate.CalendarWindow(100, floodgate.Month, zone), floodgate.CalendarWindow(200, floodgate.Month, zone), 140},
		// Another algorithm has its own state, which starts full.
		{"calendar-to-bucket", floodgate.CalendarWindow(100, floodgate.Day, zone), floodgate.TokenBucket(200, time.Minute, 200), 200},
		{"bucket-to-calendar", floodgate.TokenBucket(100, time.Minute, 100), floodgate.CalendarWindow(200, floodgate.Day, zone), 200},
	}
	for _, tc := range tests {
		for _, strategy := range strategies {
			t.Run(tc.name+"/"+strategy.String(), func(t *testing.T) {
				t.Parallel()
				clock, st, old := startRebase(t, newStore, tc.old, strategy)
				ctx := context.Background()
				opts := &floodgate.Options{Clock: clock}
				if r, err := old.AllowN(ctx, "r:a", 60); !r.Allowed || err != nil {
					t.Fatalf("AllowN(r:a, 60) = %+v, %v", r, err)
				}
				repl, err := floodgate.NewLimiter(st, []floodgate.Limit{tc.new}, opts)
				if err != nil {
					t.Fatal(err)
				}
				for i := range 2 {
					if n, err := repl.Rebase(ctx, "r:", strategy); n != 0 || err != nil {
						t.Fatalf("Rebase %d to the new limits = %d, %v; want 0, nil", i+1, n, err)
					}
				}
				if r, err := repl.Peek(ctx, "r:a"); err != nil || r.Remaining != tc.left || r.Quota != 200 {
					t.Fatalf("after Rebase r:a = %+v, %v; want %d of 200 left", r, err, tc.left)
				}
				if r, err := repl.AllowN(ctx, "r:a", 1); err != nil || !r.Allowed || r.Remaining != tc.left-1 {
					t.Fatalf("AllowN(r:a, 1) on the new limits = %+v, %v; want %d left", r, err, tc.left-1)
				}
				if n, err := old.Rebase(ctx, "r:", floodgate.AsIs); n != 0 || err != nil {
					t.Fatalf("Rebase back = %d, %v; want 0, nil", n, err)
				}
				// Back on the old calendar window, r:a has its count, with
				// the unit just taken. (Across algorithms, whether a store
				// keeps a key's state under the other algorithm is its own.)
				if tc.left != 140 {
					return
				}
				if r, err := old.Peek(ctx, "r:a"); err != nil || r.Remaining != 39 {
					t.Fatalf("back on the old limits r:a = %+v, %v; want 39 left", r, err)
				}
			})
		}
	}
}

// strategies are the four ways a rebase carries what keys used.
var strategies = []floodgate.Strategy{floodgate.Proportional, floodgate.AsIs, floodgate.Additive, floodgate.ResetUsage}

// startRebase makes a store on a fixed clock, closed when t ends, and a
// Limiter of limit on it whose first Rebase of "r:" has recorded the
// limits and carried nothing.
func startRebase(t *testing.T, newStore NewStore, limit floodgate.Limit, strategy floodgate.Strategy) (*Clock, floodgate.Store, *floodgate.Limiter) {
	t.Helper()
	clock := NewClock(Base)
	st := newStore(t, clock)
	t.Cleanup(func() { st.Close() })
	old, err := floodgate.NewLimiter(st, []floodgate.Limit{limit}, &floodgate.Options{Clock: clock})
	if err != nil {
		t.Fatal(err)
	}
	if n, err := old.Rebase(context.Background(), "r:", strategy); n != 0 || err != nil {
		t.Fatalf("first Rebase = %d, %v; want 0, nil: it only records the limits", n, err)
	}
	return clock, st, old
}
