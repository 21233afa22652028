package floodgate_test

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/floodgate/floodgate"
)

// The memory store's benchmarks. Compare them with golang.org/x/time/rate
// in the bench module: cd bench && go test -bench Memory -benchmem.

func benchLimiter(b *testing.B, limits ...floodgate.Limit) *floodgate.Limiter {
	st := floodgate.NewMemoryStore(nil)
	b.Cleanup(func() { st.Close() })
	lim, err := floodgate.NewLimiter(st, limits, nil)
	if err != nil {
		b.Fatal(err)
	}
	return lim
}

func benchKeys(n int) []string {
	keys := make([]string, n)
	for i := range keys {
		keys[i] = "key:" + strconv.Itoa(i)
	}
	return keys
}

func BenchmarkMemoryHotKey(b *testing.B) {
	for _, l := range []floodgate.Limit{
		floodgate.TokenBucket(1e9, time.Second, 1e9),
		floodgate.FixedWindow(1e12, time.Second),
		floodgate.SlidingWindow(1e12, time.Second),
		floodgate.SlidingLog(floodgate.MaxLogQuota, time.Second),
	} {
		b.Run(l.Algorithm().String(), func(b *testing.B) {
			lim := benchLimiter(b, l)
			ctx := context.Background()
			b.ReportAllocs()
			for b.Loop() {
				lim.Allow(ctx, "hot")
			}
		})
	}
}

func BenchmarkMemory10kKeys(b *testing.B) {
	lim := benchLimiter(b, floodgate.TokenBucket(1e9, time.Second, 1e9))
	keys := benchKeys(10000)
	ctx := context.Background()
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		lim.Allow(ctx, keys[i%len(keys)])
		i++
	}
}

func BenchmarkMemoryParallel(b *testing.B) {
	lim := benchLimiter(b, floodgate.TokenBucket(1e9, time.Second, 1e9))
	keys := benchKeys(10000)
	ctx := context.Background()
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		i := 0
		for pb.Next() {
			lim.Allow(ctx, keys[i%len(keys)])
			i += 7
		}
	})
}

func BenchmarkMemoryTwoLimits(b *testing.B) {
	lim := benchLimiter(b, floodgate.TokenBucket(1e9, time.Second, 1e9), floodgate.FixedWindow(1e12, time.Hour))
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		lim.Allow(ctx, "hot")
	}
}
