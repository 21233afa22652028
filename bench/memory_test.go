package bench

import (
	"context"
	"testing"
	"time"

	"github.com/floodgate/floodgate"
	"golang.org/x/time/rate"
)

// BenchmarkMemoryVsXTimeRate runs floodgate's memory store and
// golang.org/x/time/rate side by side in one run, one hot key each:
//
//	cd bench && go test -run - -bench MemoryVsXTimeRate -benchmem -count 5
//
// x/time/rate holds one bucket in one struct, with no key lookup; floodgate
// looks the key up in a sharded map. Both limits are high enough that
// every call is admitted.
func BenchmarkMemoryVsXTimeRate(b *testing.B) {
	b.Run("x-time-rate/Allow", func(b *testing.B) {
		lim := rate.NewLimiter(rate.Limit(1e9), 1e9)
		b.ReportAllocs()
		for b.Loop() {
			lim.Allow()
		}
	})
	b.Run("floodgate/Allow", func(b *testing.B) {
		lim := hotFloodgate(b)
		ctx := context.Background()
		b.ReportAllocs()
		for b.Loop() {
			lim.Allow(ctx, "hot")
		}
	})
	b.Run("x-time-rate/Allow-parallel", func(b *testing.B) {
		lim := rate.NewLimiter(rate.Limit(1e9), 1e9)
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				lim.Allow()
			}
		})
	})
	b.Run("floodgate/Allow-parallel", func(b *testing.B) {
		lim := hotFloodgate(b)
		ctx := context.Background()
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				lim.Allow(ctx, "hot")
			}
		})
	})
}

// hotFloodgate returns a limiter on the memory store whose limit admits
// every call of a benchmark.
func hotFloodgate(b *testing.B) *floodgate.Limiter {
	lim, err := floodgate.New(floodgate.TokenBucket(1e9, time.Second, 1e9))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { lim.Close() })
	return lim
}
