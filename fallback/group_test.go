package fallback_test

import (
	"context"
	"testing"
	"time"

	"github.com/floodgate/floodgate"
	"github.com/floodgate/floodgate/core"
	"github.com/floodgate/floodgate/fallback"
)

// grouping is a flaky store whose memory store decides groups, and fails
// them as the store's mode says.
type grouping struct{ *flaky }

func (g grouping) TakeGroup(ctx context.Context, reqs []core.Request, all bool) error {
	inner := make([]core.Request, len(reqs))
	for i, r := range reqs {
		r.Policy = r.Policy.(*flakyPolicy).Policy
		inner[i] = r
	}
	if err := reqs[0].Policy.(*flakyPolicy).fail(ctx); err != nil {
		return err
	}
	if err := g.flaky.Store.TakeGroup(ctx, inner, all); err != nil {
		return err
	}
	for i := range reqs {
		reqs[i].Decision = inner[i].Decision
	}
	return nil
}

// TestGroupFallsBack: a group is decided by the primary in one step while
// it answers, by the local limiter in one step while it fails (all or
// nothing still, from the local share), and by the primary again after.
func TestGroupFallsBack(t *testing.T) {
	f := newFixture(t, fallback.Options{Mode: fallback.Local, Threshold: 1000})
	st := fallback.New(grouping{f.primary}, &fallback.Options{Clock: f.clock, Budget: 20 * time.Millisecond, Threshold: 1000})
	t.Cleanup(func() { st.Close() })
	a := limiter(t, st, floodgate.FixedWindow(10, time.Hour))
	b := limiter(t, st, floodgate.FixedWindow(3, time.Hour))
	ctx := context.Background()
	group := func() []floodgate.Request {
		return []floodgate.Request{{Limiter: a, Key: "a", N: 1}, {Limiter: b, Key: "b", N: 1}}
	}
	run := func(want floodgate.Source, allowed bool) {
		t.Helper()
		reqs := group()
		if err := floodgate.AllowGroup(ctx, reqs, true); err != nil {
			t.Fatal(err)
		}
		for i, r := range reqs {
			if r.Result.Source != want || r.Result.Allowed != allowed {
				t.Fatalf("request %d: %+v, want allowed %v from %v", i, r.Result, allowed, want)
			}
		}
	}
	run(floodgate.SourceStore, true)
	calls := f.primary.calls.Load()
	if calls != 1 {
		t.Errorf("the primary saw %d calls for a group, want 1", calls)
	}
	f.primary.mode.Store(int32(failing))
	// b's local share starts where the primary left it, 2 of 3: two
	// groups pass, and the third is undone, a's charge too.
	run(floodgate.SourceLocal, true)
	run(floodgate.SourceLocal, true)
	run(floodgate.SourceLocal, false)
	if r, err := a.Peek(ctx, "a"); err != nil || r.Remaining != 7 || r.Source != floodgate.SourceLocal {
		t.Errorf("a locally after an undone group: %+v, %v; want 7 remaining", r, err)
	}
	f.primary.mode.Store(int32(healthy))
	r, err := a.Peek(ctx, "a")
	if err != nil || r.Remaining != 9 {
		t.Errorf("a on the primary after the local group: %+v, %v; want 9 remaining (the ledger settles later)", r, err)
	}
}

// TestGroupFailOpenAsksOnce: when the primary fails a group under
// FailOpen or FailClosed, every request gets the policy's answer at once,
// and the primary is not asked again for each.
func TestGroupFailOpenAsksOnce(t *testing.T) {
	for _, tt := range []struct {
		policy  fallback.Mode
		source  floodgate.Source
		allowed bool
	}{
		{fallback.FailOpen, floodgate.SourceFailOpen, true},
		{fallback.FailClosed, floodgate.SourceFailClosed, false},
	} {
		t.Run(tt.policy.String(), func(t *testing.T) {
			f := newFixture(t, fallback.Options{Mode: tt.policy, Threshold: 1000})
			st := fallback.New(grouping{f.primary}, &fallback.Options{Mode: tt.policy, Clock: f.clock, Budget: 20 * time.Millisecond, Threshold: 1000})
			t.Cleanup(func() { st.Close() })
			a := limiter(t, st, floodgate.FixedWindow(10, time.Hour))
			f.primary.mode.Store(int32(failing))
			reqs := []floodgate.Request{{Limiter: a, Key: "a", N: 1}, {Limiter: a, Key: "b", N: 1}, {Limiter: a, Key: "c", N: 1}}
			if err := floodgate.AllowGroup(context.Background(), reqs, true); err != nil {
				t.Fatal(err)
			}
			for i, r := range reqs {
				if r.Result.Source != tt.source || r.Result.Allowed != tt.allowed {
					t.Errorf("request %d: %+v, want allowed %v from %v", i, r.Result, tt.allowed, tt.source)
				}
			}
			if calls := f.primary.calls.Load(); calls != 1 {
				t.Errorf("the failing primary was asked %d times for one group, want 1", calls)
			}
		})
	}
}
