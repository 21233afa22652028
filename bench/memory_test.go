package bench

import (
	"context"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
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

// BenchmarkMemoryVsXTimeRateKeys is BenchmarkMemoryVsXTimeRate on 10,000
// keys, visited in turn as redisbench's in-process cells visit them, with
// x/time/rate as users deploy it for many keys: one Limiter per key in a
// sync.Map.
//
//	cd bench && go test -run - -bench MemoryVsXTimeRateKeys -benchmem -count 5
func BenchmarkMemoryVsXTimeRateKeys(b *testing.B) {
	names := make([]string, 10000)
	for i := range names {
		names[i] = "k" + strconv.Itoa(i)
	}
	var lims sync.Map
	xAllow := func(key string) bool {
		l, ok := lims.Load(key)
		if !ok {
			l, _ = lims.LoadOrStore(key, rate.NewLimiter(rate.Limit(1e9), 1e9))
		}
		return l.(*rate.Limiter).Allow()
	}
	fg := hotFloodgate(b)
	ctx := context.Background()
	fgAllow := func(key string) bool {
		r, _ := fg.Allow(ctx, key)
		return r.Allowed
	}
	for _, p := range []struct {
		name  string
		allow func(string) bool
	}{{"x-time-rate", xAllow}, {"floodgate", fgAllow}} {
		for _, n := range names { // every key known, as after warm-up
			p.allow(n)
			p.allow(n)
		}
		b.Run(p.name+"/Allow", func(b *testing.B) {
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				p.allow(names[i])
				if i++; i == len(names) {
					i = 0
				}
			}
		})
		b.Run(p.name+"/Allow-parallel", func(b *testing.B) {
			b.ReportAllocs()
			// Goroutine g visits keys g, g+G, g+2G, ... (G goroutines), as
			// redisbench's goroutines do: walking the same keys from
			// different starts, one goroutine catches up with another and
			// the two then go on in step, each waiting for the other's
			// lock on every key, which made the figures bimodal.
			var next atomic.Int64
			stride := runtime.GOMAXPROCS(0)
			b.RunParallel(func(pb *testing.PB) {
				i := int(next.Add(1)-1) % len(names)
				for pb.Next() {
					p.allow(names[i])
					if i += stride; i >= len(names) {
						i -= len(names)
					}
				}
			})
		})
	}
}
