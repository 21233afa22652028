package storetest

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/floodgate/floodgate"
)

// This file holds the scenarios of floodgate.AllowGroup: several requests
// on several keys and Limiters of one store, decided in order, with and
// without all-or-nothing.

// groupLimits are the Limiters of every group scenario, by index.
var groupLimits = [][]floodgate.Limit{
	{floodgate.TokenBucket(10, sec, 5)},                                // 0: T = 100ms, τ = 500ms
	{floodgate.FixedWindow(3, sec)},                                    // 1
	{floodgate.SlidingWindow(4, sec)},                                  // 2
	{floodgate.SlidingLog(2, sec)},                                     // 3
	{floodgate.TokenBucket(10, sec, 5), floodgate.FixedWindow(3, sec)}, // 4: two limits on a key
}

// GroupReq is one request of a GroupScenario: a cost on a key under the
// Limiter of groupLimits at Lim.
type GroupReq struct {
	Lim             int
	Key             string
	N               int64
	Force, Advisory bool
}

// GroupScenario runs Before one request at a time (AllowN), then Group as
// one AllowGroup call, and checks its Results against Want; then it peeks
// at every key of the group and checks After.
type GroupScenario struct {
	Name   string
	Before []GroupReq
	Group  []GroupReq
	All    bool
	Want   []floodgate.Result
	After  []floodgate.Result // a peek per request of Group, in order
	Err    error              // the error AllowGroup must return, if any
}

// GroupScenarios returns the group scenarios. Every expected value was
// worked out by hand, as the other scenarios' were.
func GroupScenarios() []GroupScenario {
	fullLog := []GroupReq{{Lim: 3, Key: "b", N: 2}}
	mixed := []GroupReq{{Lim: 0, Key: "a", N: 1}, {Lim: 1, Key: "c", N: 1}, {Lim: 2, Key: "d", N: 1}, {Lim: 4, Key: "m", N: 1}, {Lim: 3, Key: "b", N: 1}}
	logDenied := no(2, 0, sec, sec)
	return []GroupScenario{
		{
			// The sliding log is full: every other request is given back,
			// exactly, on every algorithm.
			Name: "all-or-nothing/undone", Before: fullLog, Group: mixed, All: true,
			Want:  []floodgate.Result{undone(5, 5, 0), undone(3, 3, 0), undone(4, 4, 0), at(undone(3, 3, 0), 1), logDenied},
			After: []floodgate.Result{ok(5, 5, 0), ok(3, 3, 0), ok(4, 4, 0), at(ok(3, 3, 0), 1), ok(2, 0, sec)},
		},
		{
			Name: "each/kept", Before: fullLog, Group: mixed, All: false,
			Want:  []floodgate.Result{ok(5, 4, 100*ms), ok(3, 2, sec), ok(4, 3, 2*sec), at(ok(3, 2, sec), 1), logDenied},
			After: []floodgate.Result{ok(5, 4, 100*ms), ok(3, 2, sec), ok(4, 3, 2*sec), at(ok(3, 2, sec), 1), ok(2, 0, sec)},
		},
		{
			Name: "all-or-nothing/all-allowed", Group: mixed[:4], All: true,
			Want:  []floodgate.Result{ok(5, 4, 100*ms), ok(3, 2, sec), ok(4, 3, 2*sec), at(ok(3, 2, sec), 1)},
			After: []floodgate.Result{ok(5, 4, 100*ms), ok(3, 2, sec), ok(4, 3, 2*sec), at(ok(3, 2, sec), 1)},
		},
		{
			// The second request on a key sees the first's charge.
			Name:  "each/one-key-in-order",
			Group: []GroupReq{{Lim: 0, Key: "a", N: 3}, {Lim: 0, Key: "a", N: 3}},
			Want:  []floodgate.Result{ok(5, 2, 300*ms), no(5, 2, 100*ms, 300*ms)},
			After: []floodgate.Result{ok(5, 2, 300*ms), ok(5, 2, 300*ms)},
		},
		{
			Name:  "all-or-nothing/one-key-in-order",
			Group: []GroupReq{{Lim: 0, Key: "a", N: 3}, {Lim: 0, Key: "a", N: 3}}, All: true,
			Want:  []floodgate.Result{undone(5, 5, 0), no(5, 2, 100*ms, 300*ms)},
			After: []floodgate.Result{ok(5, 5, 0), ok(5, 5, 0)},
		},
		{
			Name: "all-or-nothing/advisory-denial-keeps", Before: fullLog, All: true,
			Group: []GroupReq{{Lim: 0, Key: "a", N: 1}, {Lim: 3, Key: "b", N: 1, Advisory: true}},
			Want:  []floodgate.Result{ok(5, 4, 100*ms), logDenied},
			After: []floodgate.Result{ok(5, 4, 100*ms), ok(2, 0, sec)},
		},
		{
			// A forced charge takes at most the quota, whatever the limit
			// says.
			Name:  "all-or-nothing/forced",
			Group: []GroupReq{{Lim: 1, Key: "c", N: 5, Force: true}, {Lim: 0, Key: "a", N: 1}}, All: true,
			Want:  []floodgate.Result{ok(3, 0, sec), ok(5, 4, 100*ms)},
			After: []floodgate.Result{ok(3, 0, sec), ok(5, 4, 100*ms)},
		},
		{
			Name: "all-or-nothing/forced-undone", Before: fullLog, All: true,
			Group: []GroupReq{{Lim: 1, Key: "c", N: 5, Force: true}, {Lim: 3, Key: "b", N: 1}},
			Want:  []floodgate.Result{undone(3, 3, 0), logDenied},
			After: []floodgate.Result{ok(3, 3, 0), ok(2, 0, sec)},
		},
		{
			Name:  "invalid-key-charges-nothing",
			Group: []GroupReq{{Lim: 0, Key: "a", N: 1}, {Lim: 1, Key: "", N: 1}},
			Err:   floodgate.ErrInvalidKey,
		},
		{
			Name:  "negative-cost-charges-nothing",
			Group: []GroupReq{{Lim: 0, Key: "a", N: 1}, {Lim: 1, Key: "c", N: -1}}, All: true,
			Err: floodgate.ErrInvalidCost,
		},
	}
}

// undone is the Result of a request that an all-or-nothing group undid:
// not allowed, RetryAfter 0, the state after the refund.
func undone(limit, remaining int64, reset time.Duration) floodgate.Result {
	return floodgate.Result{Quota: limit, Remaining: remaining, ResetAfter: reset}
}

// RunGroupScenario runs sc on a fresh store from newStore.
func RunGroupScenario(t *testing.T, newStore NewStore, sc GroupScenario) {
	t.Helper()
	clock := NewClock(Base)
	st := newStore(t, clock)
	t.Cleanup(func() { st.Close() })
	lims := make([]*floodgate.Limiter, len(groupLimits))
	for i, ls := range groupLimits {
		var err error
		if lims[i], err = floodgate.NewLimiter(st, ls, &floodgate.Options{Clock: clock}); err != nil {
			t.Fatalf("NewLimiter: %v", err)
		}
	}
	ctx := context.Background()
	for i, r := range sc.Before {
		if _, err := lims[r.Lim].AllowN(ctx, r.Key, r.N); err != nil {
			t.Fatalf("before %d: %v", i, err)
		}
	}
	reqs := make([]floodgate.Request, len(sc.Group))
	for i, r := range sc.Group {
		reqs[i] = floodgate.Request{Limiter: lims[r.Lim], Key: r.Key, N: r.N, Force: r.Force, Advisory: r.Advisory}
	}
	err := floodgate.AllowGroup(ctx, reqs, sc.All)
	if sc.Err != nil {
		if !errors.Is(err, sc.Err) {
			t.Fatalf("AllowGroup error = %v, want %v", err, sc.Err)
		}
		// Nothing was charged.
		for i, r := range sc.Group {
			if r.Key == "" {
				continue
			}
			got, err := lims[r.Lim].Peek(ctx, r.Key)
			if err != nil {
				t.Fatalf("peek %d: %v", i, err)
			}
			if l := groupLimits[r.Lim][got.Index]; got.Remaining != l.Quota() {
				t.Errorf("peek %d after a failed group: remaining %d, want %d (full)", i, got.Remaining, l.Quota())
			}
		}
		return
	}
	if err != nil {
		t.Fatalf("AllowGroup: %v", err)
	}
	check := func(what string, i int, got, want floodgate.Result) {
		t.Helper()
		got.Source = 0
		want.Name = groupLimits[sc.Group[i].Lim][want.Index].Name()
		if got != want {
			t.Errorf("%s %d:\n got %s\nwant %s", what, i, fmtResult(got), fmtResult(want))
		}
	}
	for i := range reqs {
		check("result", i, reqs[i].Result, sc.Want[i])
	}
	for i, r := range sc.Group {
		got, err := lims[r.Lim].Peek(ctx, r.Key)
		if err != nil {
			t.Fatalf("peek %d: %v", i, err)
		}
		check("peek after", i, got, sc.After[i])
	}
}

// runGroupConcurrency runs all-or-nothing groups of two keys from many
// goroutines: exactly as many groups pass as the smaller limit admits, and
// both keys count them alike.
func runGroupConcurrency(t *testing.T, newStore NewStore) {
	clock := NewClock(Base)
	st := newStore(t, clock)
	t.Cleanup(func() { st.Close() })
	a, err := floodgate.NewLimiter(st, []floodgate.Limit{floodgate.FixedWindow(100, hr)}, nil)
	if err != nil {
		t.Fatal(err)
	}
	b, err := floodgate.NewLimiter(st, []floodgate.Limit{floodgate.TokenBucket(1, hr, 50)}, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	var wg sync.WaitGroup
	var mu sync.Mutex
	passed := 0
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 20 {
				reqs := []floodgate.Request{{Limiter: a, Key: "ga", N: 1}, {Limiter: b, Key: "gb", N: 1}}
				if err := floodgate.AllowGroup(ctx, reqs, true); err != nil {
					t.Error(err)
					return
				}
				if reqs[0].Result.Allowed != reqs[1].Result.Allowed {
					t.Errorf("one request of an all-or-nothing group passed alone: %+v, %+v", reqs[0].Result, reqs[1].Result)
					return
				}
				if reqs[1].Result.Allowed {
					mu.Lock()
					passed++
					mu.Unlock()
				}
			}
		}()
	}
	wg.Wait()
	ra, _ := a.Peek(ctx, "ga")
	rb, _ := b.Peek(ctx, "gb")
	if passed != 50 || ra.Remaining != 50 || rb.Remaining != 0 {
		t.Errorf("%d groups passed, remaining %d and %d; want 50 passed, remaining 50 and 0", passed, ra.Remaining, rb.Remaining)
	}
}
