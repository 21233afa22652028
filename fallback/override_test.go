package fallback_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/floodgate/floodgate"
	"github.com/floodgate/floodgate/fallback"
)

// TestOverrideDuringOutage checks that a key keeps its override when the
// primary fails: one that this process set, and one that another process
// set and this one learnt from the primary's decisions.
func TestOverrideDuringOutage(t *testing.T) {
	ctx := context.Background()
	base := floodgate.TokenBucket(10, time.Second, 8)
	big := []floodgate.Limit{floodgate.TokenBucket(10, time.Second, 20)}
	tests := []struct {
		name string
		set  func(t *testing.T, f *fixture, lim *floodgate.Limiter)
	}{
		{"set here", func(t *testing.T, f *fixture, lim *floodgate.Limiter) {
			if err := lim.SetOverride(ctx, "k", floodgate.Override{Limits: big}, floodgate.Additive); err != nil {
				t.Fatal(err)
			}
		}},
		{"set by another process", func(t *testing.T, f *fixture, lim *floodgate.Limiter) {
			other := limiter(t, f.primary.Store, base)
			if err := other.SetOverride(ctx, "k", floodgate.Override{Limits: big}, floodgate.Additive); err != nil {
				t.Fatal(err)
			}
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newFixture(t, fallback.Options{Mode: fallback.Local, Instances: 1, Threshold: 1000})
			lim := limiter(t, f.store, base)
			tt.set(t, f, lim)
			r, err := lim.Allow(ctx, "k")
			if err != nil || !r.Allowed || !r.Overridden || r.Quota != 20 || r.Source != floodgate.SourceStore {
				t.Fatalf("Allow on the primary = %+v, %v; want allowed by the override of 20", r, err)
			}
			f.primary.mode.Store(int32(failing))
			allowed := 0
			for range 20 {
				r, err := lim.Allow(ctx, "k")
				if err != nil {
					t.Fatal(err)
				}
				if r.Source != floodgate.SourceLocal || !r.Overridden {
					t.Fatalf("Allow during the outage = %+v; want the local store's, overridden", r)
				}
				if r.Allowed {
					allowed++
				}
			}
			if allowed != 19 {
				t.Errorf("the local store allowed %d of 20 during the outage, want the override's 19 left", allowed)
			}
			// A change while the primary fails is refused, and changes nothing.
			if err := lim.DeleteOverride(ctx, "k", floodgate.Additive); !errors.Is(err, floodgate.ErrStore) {
				t.Errorf("DeleteOverride during the outage: %v, want ErrStore", err)
			}
			f.primary.mode.Store(int32(healthy))
			if o, ok, err := lim.GetOverride(ctx, "k"); err != nil || !ok || o.Limits[0].Quota() != 20 {
				t.Errorf("GetOverride after the outage = %+v, %v, %v; want the override", o, ok, err)
			}
		})
	}
}
