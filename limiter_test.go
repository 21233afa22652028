package floodgate_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/floodgate/floodgate"
	"github.com/floodgate/floodgate/storetest"
	"go.uber.org/goleak"
)

func newTestLimiter(t *testing.T, limits ...floodgate.Limit) (*floodgate.Limiter, *floodgate.MemoryStore, *storetest.Clock) {
	t.Helper()
	clock := storetest.NewClock(storetest.Base)
	st := floodgate.NewMemoryStore(&floodgate.MemoryOptions{Clock: clock, SweepInterval: -1})
	t.Cleanup(func() { st.Close() })
	lim, err := floodgate.NewLimiter(st, limits, &floodgate.Options{Clock: clock})
	if err != nil {
		t.Fatal(err)
	}
	return lim, st, clock
}

func TestWait(t *testing.T) {
	ctx := context.Background()
	tests := []struct {
		name    string
		ctx     func(now time.Time) (context.Context, context.CancelFunc)
		n       int64
		wantErr error
		waited  time.Duration
	}{
		{"waits for the refill", nil, 1, nil, 100 * time.Millisecond},
		{"cost can never fit", nil, 6, floodgate.ErrCostTooHigh, 0},
		{"deadline too close", func(now time.Time) (context.Context, context.CancelFunc) {
			return context.WithDeadline(ctx, now.Add(50*time.Millisecond))
		}, 1, floodgate.ErrDeadline, 0},
		{"deadline far enough", func(now time.Time) (context.Context, context.CancelFunc) {
			return context.WithDeadline(ctx, now.Add(time.Hour))
		}, 1, nil, 100 * time.Millisecond},
		{"cancelled", func(time.Time) (context.Context, context.CancelFunc) {
			c, cancel := context.WithCancel(ctx)
			cancel()
			return c, cancel
		}, 1, context.Canceled, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			lim, _, clock := newTestLimiter(t, floodgate.TokenBucket(10, time.Second, 5))
			// Contexts' deadlines are real times, so this test's clock
			// starts at the real time (and still moves only when told).
			clock.Set(time.Now())
			for i := 0; i < 5; i++ {
				if r, err := lim.Allow(ctx, "k"); err != nil || !r.Allowed {
					t.Fatalf("drain %d: %+v %v", i, r, err)
				}
			}
			c := ctx
			if tt.ctx != nil {
				var cancel context.CancelFunc
				c, cancel = tt.ctx(clock.Now())
				defer cancel()
			}
			start := clock.Now()
			err := lim.WaitN(c, "k", tt.n)
			if !errors.Is(err, tt.wantErr) {
				t.Fatalf("Wait = %v, want %v", err, tt.wantErr)
			}
			if got := clock.Now().Sub(start); got != tt.waited {
				t.Errorf("waited %s, want %s", got, tt.waited)
			}
		})
	}
}

func TestNewErrors(t *testing.T) {
	if _, err := floodgate.New(); !errors.Is(err, floodgate.ErrNoLimits) {
		t.Errorf("New() = %v, want ErrNoLimits", err)
	}
	if _, err := floodgate.New(floodgate.PerSecond(0)); !errors.Is(err, floodgate.ErrInvalidLimit) {
		t.Errorf("New(PerSecond(0)) = %v, want ErrInvalidLimit", err)
	}
	if _, err := floodgate.NewLimiter(nil, []floodgate.Limit{floodgate.PerSecond(1)}, nil); err == nil {
		t.Error("NewLimiter(nil store) succeeded")
	}
	lim, err := floodgate.New(floodgate.PerSecond(1))
	if err != nil {
		t.Fatal(err)
	}
	if err := lim.Close(); err != nil {
		t.Fatal(err)
	}
	if err := lim.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	if _, err := lim.Allow(context.Background(), "k"); !errors.Is(err, floodgate.ErrClosed) {
		t.Errorf("Allow after Close = %v, want ErrClosed", err)
	}
}

func TestMemoryStoreRemovesIdleKeys(t *testing.T) {
	ctx := context.Background()
	lim, st, clock := newTestLimiter(t, floodgate.TokenBucket(1, time.Second, 2), floodgate.SlidingLog(3, time.Minute))
	for i := 0; i < 100; i++ {
		if _, err := lim.Allow(ctx, fmt.Sprint("key", i)); err != nil {
			t.Fatal(err)
		}
	}
	// Peeks and denials of fresh keys store nothing.
	if _, err := lim.Peek(ctx, "peeked"); err != nil {
		t.Fatal(err)
	}
	if _, err := lim.AllowN(ctx, "too-big", 10); err != nil {
		t.Fatal(err)
	}
	if got := st.Len(); got != 100 {
		t.Fatalf("Len = %d, want 100", got)
	}
	clock.Advance(59 * time.Second)
	if n := st.Sweep(); n != 0 {
		t.Fatalf("Sweep removed %d keys that are not back to full", n)
	}
	clock.Advance(time.Second)
	if n := st.Sweep(); n != 100 || st.Len() != 0 {
		t.Fatalf("Sweep removed %d, Len %d; want 100 and 0", n, st.Len())
	}
}

func TestMemoryStoreMaxKeys(t *testing.T) {
	ctx := context.Background()
	clock := storetest.NewClock(storetest.Base)
	st := floodgate.NewMemoryStore(&floodgate.MemoryOptions{Clock: clock, MaxKeys: 64, Shards: 4, SweepInterval: -1})
	defer st.Close()
	lim, err := floodgate.NewLimiter(st, []floodgate.Limit{floodgate.TokenBucket(1, time.Hour, 1)}, nil)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 10000; i++ {
		if _, err := lim.Allow(ctx, fmt.Sprint("flood", i)); err != nil {
			t.Fatal(err)
		}
		if st.Len() > 64 {
			t.Fatalf("after %d keys the store holds %d, more than MaxKeys 64", i+1, st.Len())
		}
	}
	if st.Evictions() == 0 {
		t.Fatal("no evictions counted")
	}
	// Keys that are back to full go first, and their eviction is not
	// counted. 8 new keys cannot overfill a shard of 16 on their own.
	clock.Advance(2 * time.Hour)
	before := st.Evictions()
	for i := 0; i < 8; i++ {
		if _, err := lim.Allow(ctx, fmt.Sprint("later", i)); err != nil {
			t.Fatal(err)
		}
	}
	if st.Evictions() != before {
		t.Fatalf("evicted %d live keys while expired ones were there", st.Evictions()-before)
	}
}

// The probe of the hardening issue: a key denied on its second request
// must stay denied through a flood of 1.1 million new keys whose periods
// an attacker chose so long that they are never back to full. (Evicting
// the key that would be full soonest chose the victim.)
func TestMemoryStoreFloodKeepsVictim(t *testing.T) {
	ctx := context.Background()
	clock := storetest.NewClock(storetest.Base)
	st := floodgate.NewMemoryStore(&floodgate.MemoryOptions{Clock: clock, SweepInterval: -1})
	defer st.Close()
	victim := storetest.Limiter(t, st, floodgate.GCRA(0, 1, time.Hour))
	flood := storetest.Limiter(t, st, floodgate.GCRA(0, 1, 281474976*time.Second))
	for i, want := range []bool{true, false} {
		if r, err := victim.Allow(ctx, "victim"); err != nil || r.Allowed != want {
			t.Fatalf("victim request %d: %+v, %v", i, r, err)
		}
	}
	for i := range 1_100_000 {
		if _, err := flood.Allow(ctx, "k"+strconv.Itoa(i)); err != nil {
			t.Fatal(err)
		}
	}
	if st.Evictions() == 0 {
		t.Fatal("the flood evicted nothing: it did not reach the bound")
	}
	if r, err := victim.Allow(ctx, "victim"); err != nil || r.Allowed {
		t.Fatalf("after the flood the victim is allowed again: %+v, %v", r, err)
	}
}

// MaxBytes counts the keys' bytes: long keys fill the store sooner.
func TestMemoryStoreMaxBytes(t *testing.T) {
	ctx := context.Background()
	const maxBytes = 1 << 20
	st := floodgate.NewMemoryStore(&floodgate.MemoryOptions{Clock: storetest.NewClock(storetest.Base), MaxBytes: maxBytes, Shards: 4, SweepInterval: -1})
	defer st.Close()
	lim := storetest.Limiter(t, st, floodgate.TokenBucket(1, time.Hour, 1))
	pad := strings.Repeat("x", 500)
	for i := range 10000 {
		if _, err := lim.Allow(ctx, pad+strconv.Itoa(i)); err != nil {
			t.Fatal(err)
		}
		if b := st.Bytes(); b > maxBytes {
			t.Fatalf("after %d keys of 500+ bytes the store counts %d bytes, more than %d", i+1, b, maxBytes)
		}
	}
	if n := st.Len(); n < 1000 || n > 2000 {
		t.Errorf("%d keys of 500 bytes in 1 MiB, want about 1,500", n)
	}
	// A sliding log's entries count too.
	clock := storetest.NewClock(storetest.Base)
	logs := floodgate.NewMemoryStore(&floodgate.MemoryOptions{Clock: clock, SweepInterval: -1})
	defer logs.Close()
	log := storetest.Limiter(t, logs, floodgate.SlidingLog(floodgate.MaxLogQuota, time.Hour))
	log.Allow(ctx, "log")
	before := logs.Bytes()
	for range 100 {
		clock.Advance(time.Millisecond)
		if _, err := log.Allow(ctx, "log"); err != nil {
			t.Fatal(err)
		}
	}
	if grew := logs.Bytes() - before; grew < 100*16 {
		t.Errorf("a sliding log of 100 more entries added %d bytes, want at least %d", grew, 100*16)
	}
}

func TestMemoryStoreCloseStopsSweeper(t *testing.T) {
	st := floodgate.NewMemoryStore(&floodgate.MemoryOptions{SweepInterval: time.Millisecond})
	lim, err := floodgate.NewLimiter(st, []floodgate.Limit{floodgate.PerSecond(1)}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Close(); err != nil {
		t.Fatal(err)
	}
	if err := st.Close(); err != nil {
		t.Fatal(err)
	}
	if err := lim.Reset(context.Background(), "k"); !errors.Is(err, floodgate.ErrClosed) {
		t.Fatalf("Reset after Close = %v", err)
	}
}

func TestMemoryStoreNoAllocations(t *testing.T) {
	ctx := context.Background()
	for _, l := range []floodgate.Limit{
		floodgate.TokenBucket(1000, time.Second, 100),
		floodgate.FixedWindow(100, time.Second),
		floodgate.SlidingWindow(100, time.Second),
		floodgate.SlidingLog(100, time.Second),
	} {
		lim, _, clock := newTestLimiter(t, l, floodgate.PerHour(1<<30))
		if _, err := lim.Allow(ctx, "hot"); err != nil {
			t.Fatal(err)
		}
		allocs := testing.AllocsPerRun(1000, func() {
			clock.Advance(time.Millisecond)
			if _, err := lim.Allow(ctx, "hot"); err != nil {
				t.Fatal(err)
			}
		})
		if allocs != 0 {
			t.Errorf("%s: %v allocations per decision on an existing key, want 0", l.Algorithm(), allocs)
		}
	}
}

// No test leaves a goroutine behind.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestSettle charges an estimate, then settles the real cost: the key
// ends as if the real cost had been charged, within MaxSettleQuotas
// quotas of debt.
func TestSettle(t *testing.T) {
	for _, tc := range []struct {
		name           string
		estimate, cost int64
		remaining      int64 // after the settle
		retryAfterNext time.Duration
		wantErr        error
	}{
		{name: "refund the difference", estimate: 8, cost: 3, remaining: 7},
		{name: "nothing to settle", estimate: 4, cost: 4, remaining: 6},
		{name: "charge the rest", estimate: 2, cost: 9, remaining: 1},
		{name: "into debt", estimate: 2, cost: 15, remaining: 0, retryAfterNext: 6 * time.Second},
		{name: "a cost of several quotas", estimate: 0, cost: 45, remaining: 0, retryAfterNext: 36 * time.Second},
		{name: "debt capped at MaxSettleQuotas", estimate: 0, cost: 1000, remaining: 0, retryAfterNext: time.Duration(floodgate.MaxSettleQuotas*10-9) * time.Second},
		{name: "refund to zero cost", estimate: 10, cost: 0, remaining: 10},
		{name: "negative cost", estimate: 1, cost: -1, wantErr: floodgate.ErrInvalidCost},
		{name: "negative estimate", estimate: -1, cost: 1, wantErr: floodgate.ErrInvalidCost},
	} {
		t.Run(tc.name, func(t *testing.T) {
			lim, _, _ := newTestLimiter(t, floodgate.TokenBucket(1, time.Second, 10))
			ctx := context.Background()
			if tc.estimate > 0 {
				if r, err := lim.AllowN(ctx, "k", tc.estimate); err != nil || !r.Allowed {
					t.Fatalf("estimate: %+v, %v", r, err)
				}
			}
			r, err := lim.Settle(ctx, "k", max(tc.estimate, 0), tc.cost)
			if tc.estimate < 0 {
				r, err = lim.Settle(ctx, "k", tc.estimate, tc.cost)
			}
			if tc.wantErr != nil {
				if !errors.Is(err, tc.wantErr) {
					t.Fatalf("error %v, want %v", err, tc.wantErr)
				}
				return
			}
			if err != nil || r.Remaining != tc.remaining {
				t.Fatalf("Settle: remaining %d, %v; want %d", r.Remaining, err, tc.remaining)
			}
			next, err := lim.Allow(ctx, "k")
			if err != nil {
				t.Fatal(err)
			}
			if next.Allowed != (tc.retryAfterNext == 0) || next.RetryAfter != tc.retryAfterNext {
				t.Errorf("next request: allowed %v, retry %v; want retry %v", next.Allowed, next.RetryAfter, tc.retryAfterNext)
			}
		})
	}
}
