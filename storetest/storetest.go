// Package storetest is the conformance suite that every floodgate.Store
// must pass: the in-memory store, the Redis store, and any store you write.
//
//	func TestConformance(t *testing.T) {
//		storetest.Run(t, func(t *testing.T, clock floodgate.Clock) floodgate.Store {
//			return mystore.New(&mystore.Options{Clock: clock})
//		})
//	}
//
// Every scenario runs on a fixed clock that the suite moves, and demands
// exact results: two stores that pass give identical answers. Scenarios
// cover every algorithm (bursts, refill, partial refill, time going
// backwards, peeks, costs larger than the limit, huge costs, long and
// sub-second periods), several limits on one key, reset and key
// isolation, plus the test vectors that other rate limiters publish (see
// vectors.go) and a concurrency check.
package storetest

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/floodgate/floodgate"
	"github.com/floodgate/floodgate/core"
)

// NewStore returns a fresh, empty store that reads time from clock. Run
// closes it when the test ends.
type NewStore func(t *testing.T, clock floodgate.Clock) floodgate.Store

// Base is the time at which every scenario starts: a whole hour, so that
// windows of a second, a minute or an hour start there.
var Base = time.Date(2026, 11, 22, 10, 0, 0, 0, time.UTC)

// Run runs the whole conformance suite against the stores that newStore
// makes.
func Run(t *testing.T, newStore NewStore) {
	t.Run("scenarios", func(t *testing.T) {
		for _, sc := range Scenarios() {
			t.Run(sc.Name, func(t *testing.T) {
				t.Parallel()
				RunScenario(t, newStore, sc)
			})
		}
	})
	t.Run("groups", func(t *testing.T) {
		for _, sc := range GroupScenarios() {
			t.Run(sc.Name, func(t *testing.T) {
				t.Parallel()
				RunGroupScenario(t, newStore, sc)
			})
		}
		t.Run("concurrency", func(t *testing.T) { runGroupConcurrency(t, newStore) })
	})
	t.Run("overrides", func(t *testing.T) {
		if !supportsOverrides(t, newStore) {
			t.Skip("the store keeps no overrides: GetOverride says errors.ErrUnsupported")
		}
		for _, sc := range OverrideScenarios() {
			t.Run(sc.Name, func(t *testing.T) {
				t.Parallel()
				RunScenario(t, newStore, sc)
			})
		}
		t.Run("api", func(t *testing.T) { runOverrideAPI(t, newStore) })
		t.Run("rebase", func(t *testing.T) { runRebase(t, newStore) })
	})
	t.Run("vectors", func(t *testing.T) { runVectors(t, newStore) })
	t.Run("errors", func(t *testing.T) { runErrors(t, newStore) })
	t.Run("inspect", func(t *testing.T) { runInspect(t, newStore) })
	t.Run("concurrency", func(t *testing.T) { runConcurrency(t, newStore) })
	t.Run("slots", func(t *testing.T) { RunSlots(t, newStore) })
}

// Op is what a Step does.
type Op uint8

// The operations of a Step.
const (
	Take     Op = iota // Limiter.AllowN with the step's cost
	Reset              // Limiter.Reset
	Wait               // Limiter.WaitN with the step's cost; Want.RetryAfter is how long it waited
	Charge             // Limiter.Charge with the step's cost: charged whatever the limits say
	Refund             // Limiter.Refund with the step's cost: given back
	Override           // Limiter.SetOverride with the step's Limits and Strategy, or DeleteOverride when Limits is nil
	Settle             // Limiter.Settle: the step's cost N was charged, Cost was the real cost
)

// Step is one call in a Scenario, at a time relative to Base.
type Step struct {
	At   time.Duration // clock time, as an offset from Base; steps may go back in time
	Op   Op
	Key  string // "k" when empty
	N    int64
	Want floodgate.Result
	// Repeat runs the step this many times (at least once), each expecting
	// Want except that Remaining counts down by N each time.
	Repeat int
	// Limits, Strategy and TTL are an Override step's: the key's new
	// limits (nil deletes its override), how its usage carries over, and
	// how long the override lasts (0 for ever). A result whose Want is
	// Overridden names the override's limits.
	Limits   []floodgate.Limit
	Strategy floodgate.Strategy
	TTL      time.Duration
	// Cost is a Settle step's real cost (N is what was charged).
	Cost int64
}

// Scenario is a sequence of steps on a fresh store, with the same limits
// throughout.
type Scenario struct {
	Name   string
	Limits []floodgate.Limit
	Steps  []Step
}

// RunScenario runs sc on a fresh store from newStore and fails t at the
// first result that differs from the scenario's.
func RunScenario(t *testing.T, newStore NewStore, sc Scenario) {
	t.Helper()
	clock := NewClock(Base)
	st := newStore(t, clock)
	t.Cleanup(func() { st.Close() })
	lim, err := floodgate.NewLimiter(st, sc.Limits, &floodgate.Options{Clock: clock})
	if err != nil {
		t.Fatalf("NewLimiter: %v", err)
	}
	ctx := context.Background()
	overrides := map[string][]floodgate.Limit{}
	for i, s := range sc.Steps {
		key := s.Key
		if key == "" {
			key = "k"
		}
		want := s.Want
		for r := 0; r < max(1, s.Repeat); r++ {
			clock.Set(Base.Add(s.At))
			var got floodgate.Result
			switch s.Op {
			case Take:
				got, err = lim.AllowN(ctx, key, s.N)
			case Charge:
				got, err = lim.Charge(ctx, key, s.N)
			case Refund:
				got, err = lim.Refund(ctx, key, s.N)
			case Settle:
				got, err = lim.Settle(ctx, key, s.N, s.Cost)
			case Reset:
				err = lim.Reset(ctx, key)
			case Override:
				if s.Limits == nil {
					err = lim.DeleteOverride(ctx, key, s.Strategy)
				} else {
					err = lim.SetOverride(ctx, key, floodgate.Override{Limits: s.Limits, TTL: s.TTL}, s.Strategy)
				}
				overrides[key] = s.Limits
			case Wait:
				err = lim.WaitN(ctx, key, s.N)
				got = floodgate.Result{Allowed: err == nil, RetryAfter: clock.Now().Sub(Base.Add(s.At))}
			}
			if err != nil {
				t.Fatalf("step %d (at %s, n=%d, repeat %d): %v", i, s.At, s.N, r, err)
			}
			// Source says who decided (a cache, a fallback), not what.
			got.Source = 0
			if s.Op == Take || s.Op == Charge || s.Op == Refund || s.Op == Settle {
				if want.Overridden {
					want.Name = overrides[key][want.Index].Name()
				} else {
					want.Name = sc.Limits[want.Index].Name()
				}
			}
			if got != want {
				t.Fatalf("step %d (at %s, n=%d, repeat %d):\n got %s\nwant %s", i, s.At, s.N, r, fmtResult(got), fmtResult(want))
			}
			want.Remaining -= s.N
		}
	}
}

func fmtResult(r floodgate.Result) string {
	retry := r.RetryAfter.String()
	if r.RetryAfter == floodgate.Never {
		retry = "Never"
	}
	return fmt.Sprintf("{Allowed:%v Quota:%d Remaining:%d RetryAfter:%s ResetAfter:%s Index:%d Name:%q Overridden:%v}",
		r.Allowed, r.Quota, r.Remaining, retry, r.ResetAfter, r.Index, r.Name, r.Overridden)
}

// ok and no build expected results for limit index 0.
func ok(limit, remaining int64, reset time.Duration) floodgate.Result {
	return floodgate.Result{Allowed: true, Quota: limit, Remaining: remaining, ResetAfter: reset}
}

func no(limit, remaining int64, retry, reset time.Duration) floodgate.Result {
	return floodgate.Result{Quota: limit, Remaining: remaining, RetryAfter: retry, ResetAfter: reset}
}

func at(r floodgate.Result, index int) floodgate.Result {
	r.Index = index
	return r
}

const (
	us     = time.Microsecond
	ms     = time.Millisecond
	sec    = time.Second
	minute = time.Minute
	hr     = time.Hour
	day    = 24 * time.Hour
)

func runErrors(t *testing.T, newStore NewStore) {
	st := newStore(t, NewClock(Base))
	t.Cleanup(func() { st.Close() })
	ctx := context.Background()
	good := []floodgate.Limit{floodgate.PerSecond(10)}
	tests := []struct {
		name   string
		key    string
		limits []floodgate.Limit
		n      int64
		want   error
	}{
		{"empty key", "", good, 1, floodgate.ErrInvalidKey},
		{"key too long", strings.Repeat("x", floodgate.MaxKeyLen+1), good, 1, floodgate.ErrInvalidKey},
		{"negative cost", "k", good, -1, floodgate.ErrInvalidCost},
		{"no limits", "k", nil, 1, floodgate.ErrNoLimits},
		{"too many limits", "k", make([]floodgate.Limit, floodgate.MaxLimits+1), 1, floodgate.ErrNoLimits},
		{"zero limit", "k", []floodgate.Limit{{}}, 1, floodgate.ErrInvalidLimit},
		{"zero rate", "k", []floodgate.Limit{floodgate.TokenBucket(0, sec, 1)}, 1, floodgate.ErrInvalidLimit},
		{"negative burst", "k", []floodgate.Limit{floodgate.TokenBucket(1, sec, -1)}, 1, floodgate.ErrInvalidLimit},
		{"zero period", "k", []floodgate.Limit{floodgate.SlidingLog(1, 0)}, 1, floodgate.ErrInvalidLimit},
		{"negative window", "k", []floodgate.Limit{floodgate.FixedWindow(1, -sec)}, 1, floodgate.ErrInvalidLimit},
		{"one bad limit of two", "k", []floodgate.Limit{floodgate.PerSecond(1), floodgate.GCRA(-1, 1, sec)}, 1, floodgate.ErrInvalidLimit},
	}
	for _, tt := range tests {
		// Limits are checked once, when the Limiter is made (and the store
		// prepares them); keys and costs at every call.
		lim, err := floodgate.NewLimiter(st, tt.limits, nil)
		if err != nil {
			if !errors.Is(err, tt.want) {
				t.Errorf("%s: NewLimiter error = %v, want %v", tt.name, err, tt.want)
			}
			continue
		}
		_, err = lim.AllowN(ctx, tt.key, tt.n)
		if !errors.Is(err, tt.want) {
			t.Errorf("%s: Take error = %v, want %v", tt.name, err, tt.want)
		}
		if tt.n >= 0 {
			if err := lim.Reset(ctx, tt.key); !errors.Is(err, tt.want) {
				t.Errorf("%s: Reset error = %v, want %v", tt.name, err, tt.want)
			}
		}
	}
	// A store checks what it is given to prepare, not only what a
	// Limiter would give it.
	spec := func(l floodgate.Limit) core.Spec {
		q, rate, period := l.Quota(), l.Rate(), l.Period()
		s, err := core.NewBucket("token-bucket", rate, period, q, "burst")
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	tampered := spec(floodgate.PerSecond(10))
	tampered.TQ = 0
	badSpecs := []struct {
		name  string
		specs []core.Spec
		want  error
	}{
		{"no specs", nil, floodgate.ErrNoLimits},
		{"too many specs", make([]core.Spec, floodgate.MaxLimits+1), floodgate.ErrNoLimits},
		{"zero spec", []core.Spec{{}}, floodgate.ErrInvalidLimit},
		{"tampered spec", []core.Spec{tampered}, floodgate.ErrInvalidLimit},
	}
	for _, tt := range badSpecs {
		if _, err := st.Prepare(tt.specs); !errors.Is(err, tt.want) {
			t.Errorf("%s: Prepare error = %v, want %v", tt.name, err, tt.want)
		}
	}
	// A key of exactly MaxKeyLen bytes, of any bytes, is fine.
	lim, err := floodgate.NewLimiter(st, good, nil)
	if err != nil {
		t.Fatal(err)
	}
	long := strings.Repeat("\xff{}:", floodgate.MaxKeyLen/4)
	if _, err := lim.Allow(ctx, long); err != nil {
		t.Errorf("Take with a %d-byte key: %v", len(long), err)
	}
	// After Close, everything fails with ErrClosed, and Close is safe to
	// call again.
	if err := st.Close(); err != nil {
		t.Errorf("Close: %v", err)
	}
	if _, err := lim.Allow(ctx, "k"); !errors.Is(err, floodgate.ErrClosed) {
		t.Errorf("Take after Close: %v, want ErrClosed", err)
	}
	if err := lim.Reset(ctx, "k"); !errors.Is(err, floodgate.ErrClosed) {
		t.Errorf("Reset after Close: %v, want ErrClosed", err)
	}
	if _, err := st.Prepare([]core.Spec{spec(floodgate.PerSecond(1))}); !errors.Is(err, floodgate.ErrClosed) {
		t.Errorf("Prepare after Close: %v, want ErrClosed", err)
	}
	if err := st.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
}

// runConcurrency has many goroutines hammer one key while the clock moves
// in steps, and checks that every algorithm admits exactly what it allows:
// at every clock step the goroutines ask for more than there is, so the
// total admitted is the algorithm's exact capacity over the span.
func runConcurrency(t *testing.T, newStore NewStore) {
	tests := []struct {
		name  string
		limit floodgate.Limit
		step  time.Duration
		steps int
		want  int64
	}{
		// Takes happen at steps 0..steps-1, so the span is (steps-1)*step.
		// 5 at once, then one per 100ms for 2.9s.
		{"token-bucket", floodgate.TokenBucket(10, sec, 5), 100 * ms, 30, 5 + 29},
		// 5 at once, then one per 100ms for 4.75s: 47 more.
		{"gcra", floodgate.GCRA(4, 10, sec), 250 * ms, 20, 5 + 47},
		// Takes at 0, 0.5, ..., 4.5s: five windows of 7.
		{"fixed-window", floodgate.FixedWindow(7, sec), 500 * ms, 10, 7 * 5},
		// 6 at 0s, expiring at 1s; 6 at 1s; ... five times.
		{"sliding-log", floodgate.SlidingLog(6, sec), 500 * ms, 10, 6 * 5},
		// Per half second: 8 0 | 0 4 | 4 2 | 2 3 | 3 2 | 3 2 (estimate rounds up).
		{"sliding-window", floodgate.SlidingWindow(8, sec), 500 * ms, 12, 33},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			clock := NewClock(Base)
			st := newStore(t, clock)
			t.Cleanup(func() { st.Close() })
			lim, err := floodgate.NewLimiter(st, []floodgate.Limit{tt.limit}, nil)
			if err != nil {
				t.Fatal(err)
			}
			var admitted atomic.Int64
			const workers, tries = 8, 12
			for s := 0; s < tt.steps; s++ {
				var wg sync.WaitGroup
				errs := make(chan error, workers)
				for w := 0; w < workers; w++ {
					wg.Add(1)
					go func() {
						defer wg.Done()
						for i := 0; i < tries; i++ {
							r, err := lim.Allow(context.Background(), "hot")
							if err != nil {
								errs <- err
								return
							}
							if r.Allowed {
								admitted.Add(1)
							}
						}
					}()
				}
				wg.Wait()
				close(errs)
				for err := range errs {
					t.Fatal(err)
				}
				clock.Advance(tt.step)
			}
			if got := admitted.Load(); got != tt.want {
				t.Fatalf("%d goroutines admitted %d over %d steps of %s, want exactly %d", workers, got, tt.steps, tt.step, tt.want)
			}
		})
	}
}
