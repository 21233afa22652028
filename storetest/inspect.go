package storetest

import (
	"context"
	"errors"
	"testing"
	"time"

	fg "github.com/floodgate/floodgate"
)

// runInspect checks Limiter.Inspect (core.Inspector) where the store
// implements it: each limit's state must be what a Limiter of that limit
// alone reports by Peek after the same requests, the limit that decides
// the one Peek names, and an override's limits must be reported in place
// of the Limiter's. Nothing may be charged: a second Inspect, and Peek,
// see the same state.
func runInspect(t *testing.T, newStore NewStore) {
	ctx := context.Background()
	clock := NewClock(Base)
	st := newStore(t, clock)
	defer st.Close()
	limits := []fg.Limit{
		fg.TokenBucket(10, sec, 10),
		fg.FixedWindow(5, minute).Named("per-minute"),
		fg.SlidingLog(4, minute),
		fg.SlidingWindow(6, minute),
	}
	all := Limiter(t, st, limits...)
	if _, err := all.Inspect(ctx, "fresh"); errors.Is(err, errors.ErrUnsupported) {
		t.Skip("the store cannot inspect: its Policies are not core.Inspectors")
	}
	alone := make([]*fg.Limiter, len(limits))
	for i, l := range limits {
		alone[i] = Limiter(t, st, l)
	}
	// The same requests on "k" under every limit, and on "k<i>" under
	// limit i alone; all of them fit every limit.
	for _, step := range []struct {
		at time.Duration
		n  int64
	}{{0, 1}, {10 * time.Millisecond, 2}, {250 * time.Millisecond, 0}} {
		clock.Set(Base.Add(step.at))
		if step.n == 0 {
			continue
		}
		if r, err := all.AllowN(ctx, "k", step.n); err != nil || !r.Allowed {
			t.Fatalf("AllowN(k, %d) = %s, %v; want allowed", step.n, fmtResult(r), err)
		}
		for i, lim := range alone {
			if r, err := lim.AllowN(ctx, "k"+string(rune('0'+i)), step.n); err != nil || !r.Allowed {
				t.Fatalf("limit %d alone: AllowN(%d) = %s, %v; want allowed", i, step.n, fmtResult(r), err)
			}
		}
	}
	for round := range 2 {
		in, err := all.Inspect(ctx, "k")
		if err != nil {
			t.Fatal(err)
		}
		if len(in.Results) != len(limits) || len(in.Limits) != len(limits) {
			t.Fatalf("round %d: %d results and %d limits; want %d", round, len(in.Results), len(in.Limits), len(limits))
		}
		for i, lim := range alone {
			want, err := lim.Peek(ctx, "k"+string(rune('0'+i)))
			if err != nil {
				t.Fatal(err)
			}
			want.Index, want.Name = i, limits[i].Name()
			if got := in.Results[i]; got != want {
				t.Errorf("round %d: limit %d (%s): Inspect says %s, a Limiter of it alone %s", round, i, limits[i], fmtResult(got), fmtResult(want))
			}
			if in.Limits[i].String() != limits[i].String() {
				t.Errorf("round %d: limit %d is %s; want %s", round, i, in.Limits[i], limits[i])
			}
		}
		peek, err := all.Peek(ctx, "k")
		if err != nil {
			t.Fatal(err)
		}
		if in.Result != peek {
			t.Errorf("round %d: Inspect's Result %s; Peek's %s", round, fmtResult(in.Result), fmtResult(peek))
		}
	}
	// A key never decided is full under every limit.
	in, err := all.Inspect(ctx, "never")
	if err != nil {
		t.Fatal(err)
	}
	for i, r := range in.Results {
		if r.Remaining != limits[i].Quota() || r.ResetAfter != 0 || !r.Allowed {
			t.Errorf("fresh key, limit %d: %s; want full", i, fmtResult(r))
		}
	}

	if _, _, err := all.GetOverride(ctx, "k"); errors.Is(err, errors.ErrUnsupported) {
		return
	}
	ov := []fg.Limit{fg.FixedWindow(50, minute).Named("vip")}
	if err := all.SetOverride(ctx, "k", fg.Override{Limits: ov, TTL: time.Hour}, fg.ResetUsage); err != nil {
		t.Fatal(err)
	}
	in, err = all.Inspect(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	if !in.Overridden || len(in.Limits) != 1 || in.Limits[0].String() != ov[0].String() || len(in.Results) != 1 {
		t.Fatalf("overridden key: Overridden %v, limits %v; want the override's %v", in.Overridden, in.Limits, ov)
	}
	if r := in.Results[0]; r.Quota != 50 || r.Remaining != 50 || r.Name != "vip" || !r.Overridden {
		t.Errorf("overridden key: %s; want the override's, full", fmtResult(r))
	}
}
