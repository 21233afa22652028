package fallback_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/floodgate/floodgate"
	"github.com/floodgate/floodgate/core"
	"github.com/floodgate/floodgate/fallback"
)

// TestSlotsOrphansReleasedTogether: the permits of acquires that failed on
// the primary, which ran them all the same, are released there by the
// next call, all at once (each release here waits for all the others, and
// one made after another would time out), so that the caller waits for
// them one budget at most rather than one each, and before its own op;
// those whose release fails are kept, and released by a later call.
func TestSlotsOrphansReleasedTogether(t *testing.T) {
	const orphans = 16 // one call's worth
	for _, tc := range []struct {
		name string
		fail bool // the first releases fail after they all arrive
	}{{"released", false}, {"kept when the release fails", true}} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t, fallback.Options{Threshold: 1 << 30, Budget: 5 * time.Second})
			c, err := floodgate.NewConcurrency(f.store, 1, time.Minute, nil)
			if err != nil {
				t.Fatal(err)
			}
			direct, err := floodgate.NewConcurrency(f.primary.Store, 1, time.Minute, nil)
			if err != nil {
				t.Fatal(err)
			}
			ctx := context.Background()
			held := func() (n int64) {
				t.Helper()
				for i := range orphans {
					in, err := direct.Inspect(ctx, fmt.Sprint("k", i))
					if err != nil {
						t.Fatal(err)
					}
					n += in.Held
				}
				return n
			}
			f.primary.mode.Store(int32(landing))
			for i := range orphans {
				if r, err := c.Acquire(ctx, fmt.Sprint("k", i)); err != nil || !r.Allowed || r.Source != floodgate.SourceLocal {
					t.Fatal(r, err)
				}
			}
			f.primary.mode.Store(int32(healthy))
			if n := held(); n != orphans {
				t.Fatalf("the primary holds %d permits, want the %d it granted late", n, orphans)
			}
			var arrived atomic.Int64
			all := make(chan struct{})
			f.primary.slotGate = func(ctx context.Context, op core.SlotOp) error {
				if op.Kind != core.Release {
					return nil
				}
				if arrived.Add(1) == orphans {
					close(all)
				}
				select {
				case <-all:
				case <-ctx.Done():
					return ctx.Err()
				}
				if tc.fail {
					return floodgate.ErrStore
				}
				return nil
			}
			// k0's own orphan is released first: its acquire finds the slot free.
			if r, err := c.Acquire(ctx, "k0"); err != nil || r.Allowed == tc.fail || r.Source != floodgate.SourceStore {
				t.Fatalf("acquire after the outage: %+v %v", r, err)
			}
			want := int64(1)
			if tc.fail {
				want = orphans
			}
			if n := held(); n != want || arrived.Load() != orphans {
				t.Fatalf("the primary holds %d permits after %d releases, want %d", n, arrived.Load(), want)
			}
			if !tc.fail {
				return
			}
			f.primary.slotGate = nil
			if r, err := c.Acquire(ctx, "x"); err != nil || !r.Allowed {
				t.Fatalf("acquire: %+v %v", r, err)
			}
			if n := held(); n != 0 {
				t.Fatalf("the primary holds %d permits after the kept orphans' release, want 0", n)
			}
		})
	}
}
