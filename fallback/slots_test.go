package fallback_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/floodgate/floodgate"
	"github.com/floodgate/floodgate/core"
	"github.com/floodgate/floodgate/core/slot"
	"github.com/floodgate/floodgate/fallback"
	"github.com/floodgate/floodgate/storetest"
)

// PrepareSlots makes the flaky store keep concurrency limits, failing as
// its mode says.
func (f *flaky) PrepareSlots(spec slot.Spec) (slot.Policy, error) {
	p, err := f.Store.(slot.Store).PrepareSlots(spec)
	if err != nil {
		return nil, err
	}
	return &flakySlots{f: f, Policy: p}, nil
}

type flakySlots struct {
	f *flaky
	slot.Policy
}

func (p *flakySlots) Slot(ctx context.Context, key string, op slot.Op) (slot.Verdict, core.Source, error) {
	if err := (&flakyPolicy{f: p.f}).fail(ctx); err != nil {
		return slot.Verdict{}, 0, err
	}
	if mode(p.f.mode.Load()) == landing {
		if op.Kind == slot.Acquire {
			p.Policy.Slot(ctx, key, op)
		}
		return slot.Verdict{}, 0, fmt.Errorf("%w: i/o timeout", floodgate.ErrStore)
	}
	if g := p.f.slotGate; g != nil {
		if err := g(ctx, op); err != nil {
			return slot.Verdict{}, 0, err
		}
	}
	return p.Policy.Slot(ctx, key, op)
}

// TestSlotsFallback: while the primary fails, acquires get the mode's
// answer (Local: the share of N); when it is back, permits granted
// locally are released where they are, once, and the primary's on the
// primary.
func TestSlotsFallback(t *testing.T) {
	ctx := context.Background()
	t.Run("local", func(t *testing.T) {
		f := newFixture(t, fallback.Options{Instances: 2, Threshold: 1000})
		c, err := floodgate.NewConcurrency(f.store, 4, time.Minute, nil)
		if err != nil {
			t.Fatal(err)
		}
		fromStore, err := c.Acquire(ctx, "k")
		if err != nil || !fromStore.Allowed || fromStore.Source != floodgate.SourceStore {
			t.Fatal(fromStore, err)
		}
		f.primary.mode.Store(int32(failing))
		var local []floodgate.Permit
		for i := range 3 {
			r, err := c.Acquire(ctx, "k")
			if err != nil || r.Source != floodgate.SourceLocal || r.Allowed != (i < 2) {
				t.Fatalf("acquire %d while failing: %+v %v", i, r, err)
			}
			if r.Allowed {
				local = append(local, r.Permit)
			}
		}
		// The primary's permit cannot be released or extended while it
		// fails: a store failure, so that its holder tries again, not
		// "not held"; left alone, it expires there after its lease.
		for _, op := range []func(context.Context, floodgate.Permit) (floodgate.SlotResult, error){c.Release, c.Extend} {
			if r, err := op(ctx, fromStore.Permit); !errors.Is(err, floodgate.ErrStore) {
				t.Fatalf("release or extend of the primary's permit while failing: %+v %v, want ErrStore", r, err)
			}
		}
		f.primary.mode.Store(int32(healthy))
		if r, err := c.Extend(ctx, local[0]); err != nil || !r.Allowed || r.Source != floodgate.SourceLocal {
			t.Fatalf("extend of a local permit, back: %+v %v", r, err)
		}
		for _, p := range local {
			if r, err := c.Release(ctx, p); err != nil || !r.Allowed || r.Source != floodgate.SourceLocal {
				t.Fatalf("release of a local permit, back: %+v %v", r, err)
			}
			if r, err := c.Release(ctx, p); err != nil || r.Allowed {
				t.Fatalf("second release of a local permit: %+v %v", r, err)
			}
		}
		if r, err := c.Release(ctx, fromStore.Permit); err != nil || !r.Allowed || r.Source != floodgate.SourceStore || r.Held != 0 {
			t.Fatalf("release of the primary's permit, back: %+v %v", r, err)
		}
	})
	for _, tc := range []struct {
		mode    fallback.Mode
		allowed bool
		source  floodgate.Source
	}{{fallback.FailOpen, true, floodgate.SourceFailOpen}, {fallback.FailClosed, false, floodgate.SourceFailClosed}} {
		t.Run(tc.mode.String(), func(t *testing.T) {
			f := newFixture(t, fallback.Options{Mode: tc.mode, Threshold: 1000})
			c, err := floodgate.NewConcurrency(f.store, 1, time.Minute, nil)
			if err != nil {
				t.Fatal(err)
			}
			f.primary.mode.Store(int32(failing))
			for range 3 {
				r, err := c.Acquire(ctx, "k")
				if err != nil || r.Allowed != tc.allowed || r.Source != tc.source || (!r.Allowed && r.RetryAfter <= 0) {
					t.Fatalf("%+v %v", r, err)
				}
			}
		})
	}
}

// FuzzSlots holds the fallback store's concurrency limits, over a healthy
// primary, to storetest's reference model, as the memory and Redis
// stores' FuzzSlots do.
func FuzzSlots(f *testing.F) {
	f.Add([]byte{2, 10, 0, 0, 8, 0, 0, 8, 0, 0, 8, 1, 0, 8, 2, 0, 20, 1, 1, 8})
	f.Add([]byte{4, 49, 0, 0, 8, 4, 0, 8, 8, 0, 8, 2, 1, 12, 0, 0, 22, 1, 2, 8, 0, 0, 0})
	f.Fuzz(func(t *testing.T, data []byte) {
		err := storetest.CheckSlotSequence(func(clock floodgate.Clock) floodgate.Store {
			primary := floodgate.NewMemoryStore(&floodgate.MemoryOptions{Clock: clock, SweepInterval: -1})
			return &closing{Store: fallback.New(primary, &fallback.Options{Clock: clock, Budget: -1}), also: primary}
		}, data)
		if err != nil {
			t.Fatal(err)
		}
	})
}

// closing is a store that closes another store after itself.
type closing struct {
	*fallback.Store
	also floodgate.Store
}

func (c *closing) Close() error {
	err := c.Store.Close()
	c.also.Close()
	return err
}
