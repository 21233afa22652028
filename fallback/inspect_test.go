package fallback_test

import (
	"context"
	"testing"
	"time"

	"github.com/floodgate/floodgate"
	"github.com/floodgate/floodgate/core"
	"github.com/floodgate/floodgate/fallback"
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
