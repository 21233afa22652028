package fallback_test

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/floodgate/floodgate"
	"github.com/floodgate/floodgate/fallback"
)

// BenchmarkGroup is what the fallback store adds to a group of three
// requests while its primary answers: the primary (a memory store, so that
// only the fallback's own work shows) alone, then through the fallback
// with a caller's deadline shorter than the budget (as Envoy sends one)
// and without a deadline (the budget's timer).
func BenchmarkGroup(b *testing.B) {
	for _, tc := range []struct {
		name     string
		wrap     bool
		deadline bool
	}{
		{"primary", false, true},
		{"fallback/deadline", true, true},
		{"fallback/no-deadline", true, false},
	} {
		b.Run(tc.name, func(b *testing.B) {
			primary := floodgate.NewMemoryStore(&floodgate.MemoryOptions{SweepInterval: -1})
			defer primary.Close()
			var st floodgate.Store = primary
			if tc.wrap {
				fs := fallback.New(primary, &fallback.Options{Budget: 2 * time.Hour})
				defer fs.Close()
				st = fs
			}
			lim, err := floodgate.NewLimiter(st, []floodgate.Limit{floodgate.FixedWindow(1000000, time.Second)}, nil)
			if err != nil {
				b.Fatal(err)
			}
			keys := make([]string, 3000)
			for i := range keys {
				keys[i] = "k" + strconv.Itoa(i)
			}
			ctx := context.Background()
			if tc.deadline {
				var cancel context.CancelFunc
				ctx, cancel = context.WithTimeout(ctx, time.Hour)
				defer cancel()
			}
			reqs := make([]floodgate.Request, 3)
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				for j := range reqs {
					reqs[j] = floodgate.Request{Limiter: lim, Key: keys[(i*3+j)%len(keys)], N: 1}
				}
				i++
				if err := floodgate.AllowGroup(ctx, reqs, true); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
