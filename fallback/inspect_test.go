package fallback_test

import (
	"cmp"
	"context"
	"testing"
	"time"

	"github.com/floodgate/floodgate"
	"github.com/floodgate/floodgate/core"
	"github.com/floodgate/floodgate/core/slot"
	"github.com/floodgate/floodgate/fallback"
	"github.com/floodgate/floodgate/internal/lib/storekit"
)

// Inspect makes the flaky primary a core.Inspector, failing as its Take
// does.
func (p *flakyPolicy) Inspect(ctx context.Context, key string) (core.Inspection, error) {
	if err := p.fail(ctx); err != nil {
		return core.Inspection{}, err
	}
	return p.Policy.(core.Inspector).Inspect(ctx, key)
}

// Inspect says which of the primary and the mode answers a key, with the
// local share beside the primary's state, and is no decision: it opens no
// breaker and counts no fallback.
func TestInspect(t *testing.T) {
	ctx := context.Background()
	limit := floodgate.TokenBucket(10, time.Second, 8)
	tests := []struct {
		mode      fallback.Mode
		source    floodgate.Source // while the primary fails
		quota     int64            // of the answer while it fails
		remaining int64
		allowed   bool
	}{
		{fallback.Local, floodgate.SourceLocal, 2, 0, true}, // the share of 8 by 4, charged the 2 the primary admitted
		{fallback.FailOpen, floodgate.SourceFailOpen, 8, 8, true},
		{fallback.FailClosed, floodgate.SourceFailClosed, 8, 0, false},
	}
	for _, tt := range tests {
		t.Run(tt.mode.String(), func(t *testing.T) {
			f := newFixture(t, fallback.Options{Mode: tt.mode, Instances: 4, Threshold: 1})
			lim := limiter(t, f.store, limit)
			if r, err := lim.AllowN(ctx, "k", 2); err != nil || !r.Allowed {
				t.Fatalf("AllowN: %+v, %v", r, err)
			}
			in, err := lim.Inspect(ctx, "k")
			if err != nil {
				t.Fatal(err)
			}
			fb := in.Fallback
			if in.Source != floodgate.SourceStore || in.Results[0].Remaining != 6 || in.Results[0].Quota != 8 || fb == nil || fb.Degraded || fb.Mode != tt.mode.String() || fb.Instances != 4 {
				t.Fatalf("healthy primary: %+v, fallback %+v; want the primary's 6 of 8", in, fb)
			}
			if tt.mode == fallback.Local {
				if len(fb.Local) != 1 || fb.Local[0].Quota != 2 || fb.Local[0].Remaining != 0 {
					t.Errorf("local share while the primary answers: %+v; want 0 of 2", fb.Local)
				}
			} else if fb.Local != nil {
				t.Errorf("local share under %s: %+v; want none", tt.mode, fb.Local)
			}

			f.primary.mode.Store(int32(failing))
			for range 3 { // the threshold is 1: a decision would have opened the breaker
				in, err = lim.Inspect(ctx, "k")
				if err != nil {
					t.Fatal(err)
				}
				r := in.Results[0]
				if in.Source != tt.source || !in.Fallback.Degraded || r.Quota != tt.quota || r.Remaining != tt.remaining || r.Allowed != tt.allowed {
					t.Fatalf("failing primary: %+v (%+v); want %s's %d of %d", r, in.Fallback, tt.source, tt.remaining, tt.quota)
				}
			}
			if st := f.store.State(); st != fallback.Primary {
				t.Errorf("State after inspections of a failing primary = %v; want Primary (an inspection is no decision)", st)
			}
			if n := f.store.Stats().Fallbacks; n != 0 {
				t.Errorf("Stats().Fallbacks = %d; want 0", n)
			}
		})
	}
}

// InspectSlots makes the flaky primary's slots a slot.Inspector,
// failing as its Slot does.
func (p *flakySlots) InspectSlots(ctx context.Context, key string) (slot.Inspection, error) {
	if err := (&flakyPolicy{f: p.f}).fail(ctx); err != nil {
		return slot.Inspection{}, err
	}
	return p.Policy.(slot.Inspector).InspectSlots(ctx, key)
}

// TestInspectSlotsFailOpen: InspectSlots reports the permits that FailOpen
// granted and remembers beside the primary's (or beside the mode's answer,
// none held, while the primary fails), as Local mode reports its local
// store's: how many are live on the key and the earliest expiry, until
// each is released, expires or is moved onto the primary by an extend.
// Two slots, a lease of a minute, on a fixed clock.
func TestInspectSlotsFailOpen(t *testing.T) {
	const lease = time.Minute
	f := newFixture(t, fallback.Options{Mode: fallback.FailOpen, Threshold: 1000})
	spec, err := slot.New(2, lease)
	if err != nil {
		t.Fatal(err)
	}
	sp, err := f.store.PrepareSlots(spec)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	start := f.clock.Now().UnixMicro()
	ids := map[string]string{}
	type step struct {
		primary mode
		advance time.Duration
		op      slot.OpKind // 0: none, only the look
		key     string      // of the op; "k" when empty
		permit  string
		source  core.Source // the op's
		// The look at "k": the main answer and the remembered permits.
		held, openHeld int64
		inSource       core.Source
		openEarliest   time.Duration // after the start; 0: none
	}
	steps := []step{
		{op: slot.Acquire, permit: "a", source: core.SourceStore, held: 1, inSource: core.SourceStore},
		{primary: failing, op: slot.Acquire, permit: "b", source: core.SourceFailOpen, openHeld: 1, inSource: core.SourceFailOpen, openEarliest: lease},
		{primary: failing, advance: 10 * time.Second, op: slot.Acquire, permit: "c", source: core.SourceFailOpen, openHeld: 2, inSource: core.SourceFailOpen, openEarliest: lease},
		{primary: failing, op: slot.Acquire, key: "other", permit: "x", source: core.SourceFailOpen, openHeld: 2, inSource: core.SourceFailOpen, openEarliest: lease},
		{held: 1, openHeld: 2, inSource: core.SourceStore, openEarliest: lease},
		{op: slot.Release, permit: "b", source: core.SourceFailOpen, held: 1, openHeld: 1, inSource: core.SourceStore, openEarliest: 10*time.Second + lease},
		{op: slot.Extend, permit: "c", source: core.SourceStore, held: 2, inSource: core.SourceStore},
		{primary: failing, op: slot.Acquire, permit: "d", source: core.SourceFailOpen, openHeld: 1, inSource: core.SourceFailOpen, openEarliest: 10*time.Second + lease},
		{primary: failing, advance: lease, inSource: core.SourceFailOpen},
	}
	for i, st := range steps {
		f.primary.mode.Store(int32(st.primary))
		f.clock.Advance(st.advance)
		if st.op != 0 {
			key := cmp.Or(st.key, "k")
			if st.op == slot.Acquire {
				ids[st.permit] = storekit.NewPermitID(key, [16]byte{byte(i + 1)})
			}
			v, src, err := sp.Slot(ctx, key, slot.Op{Kind: st.op, ID: ids[st.permit]})
			if err != nil || !v.OK || src != st.source {
				t.Fatalf("step %d: %s %s: %+v %v %v, want granted by %v", i, st.op, st.permit, v, src, err, st.source)
			}
		}
		in, err := sp.(slot.Inspector).InspectSlots(ctx, "k")
		if err != nil {
			t.Fatalf("step %d: %v", i, err)
		}
		open := in.Fallback.Local
		wantEarliest := int64(0)
		if st.openEarliest != 0 {
			wantEarliest = start + st.openEarliest.Microseconds()
		}
		if in.Held != st.held || in.Source != st.inSource || in.Fallback.Degraded != (st.primary == failing) || open == nil ||
			open.Held != st.openHeld || open.Earliest != wantEarliest || open.Source != core.SourceFailOpen || open.Now != in.Now {
			t.Fatalf("step %d: InspectSlots = %+v, fail-open permits %+v; want %d held from %v, and %d fail-open expiring first at %d",
				i, in, open, st.held, st.inSource, st.openHeld, wantEarliest)
		}
	}
}
