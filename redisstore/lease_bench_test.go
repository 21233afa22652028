package redisstore_test

import (
	"context"
	"fmt"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"github.com/floodgate/floodgate"
	"github.com/floodgate/floodgate/internal/testkit/redistest"
	"github.com/floodgate/floodgate/redisstore"
)

// BenchmarkLeaseHotKey is one hot key decided from leases by 64
// goroutines, as redisbench's lease cells decide it, with a limit that no
// run uses up: nearly every decision is admitted from a lease in process.
//
//	go test -run - -bench LeaseHotKey -count 5 ./redisstore
func BenchmarkLeaseHotKey(b *testing.B) {
	st := newStore(b, redistest.Start(b).Client(b), &redisstore.Options{Leases: &redisstore.LeaseOptions{}})
	lim, err := floodgate.NewLimiter(st, []floodgate.Limit{floodgate.TokenBucket(1_000_000, time.Second, 1_000_000_000)}, nil)
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	b.ReportAllocs()
	b.SetParallelism(32)
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if r, err := lim.Allow(ctx, "hot"); err != nil || !r.Allowed {
				b.Errorf("Allow = %+v, %v", r, err)
				return
			}
		}
	})
}

// BenchmarkLeaseManyKeys is 64 goroutines (32 per processor, on two)
// deciding on 10,000 keys with a limit that no run uses up, without leases
// and with them, in three walks: "spread", where each key's decisions come
// far apart, so that no key is hot; "bursts4" and "bursts16", where each 4
// or 16 goroutines walk the same keys, so that a key's decisions come 4 or
// 16 at a time. A key decided more than eight times within a lease's time
// takes a lease, which admits the rest of its burst and gives back what
// is left when its time is up: bursts of 4 take none.
//
//	go test -run - -bench LeaseManyKeys -count 5 ./redisstore
func BenchmarkLeaseManyKeys(b *testing.B) {
	srv := redistest.Start(b)
	const nkeys = 10000
	keys := make([]string, nkeys)
	for i := range keys {
		keys[i] = fmt.Sprintf("key%d", i)
	}
	for _, walk := range []struct {
		name  string
		burst int // goroutines that walk the same keys
	}{{"spread", 1}, {"bursts4", 4}, {"bursts16", 16}} {
		for _, leases := range []bool{false, true} {
			b.Run(fmt.Sprintf("walk=%s/leases=%v", walk.name, leases), func(b *testing.B) {
				opts := &redisstore.Options{}
				if leases {
					opts.Leases = &redisstore.LeaseOptions{}
				}
				st := newStore(b, srv.Client(b), opts)
				lim, err := floodgate.NewLimiter(st, []floodgate.Limit{floodgate.TokenBucket(1_000_000, time.Second, 1_000_000_000)}, nil)
				if err != nil {
					b.Fatal(err)
				}
				ctx := context.Background()
				const parallelism = 32
				walkers := parallelism * runtime.GOMAXPROCS(0) / walk.burst
				var started atomic.Int64
				b.SetParallelism(parallelism)
				b.RunParallel(func(pb *testing.PB) {
					i := int(started.Add(1)-1) / walk.burst
					for pb.Next() {
						if r, err := lim.Allow(ctx, keys[i%nkeys]); err != nil || !r.Allowed {
							b.Errorf("Allow = %+v, %v", r, err)
							return
						}
						i += walkers
					}
				})
			})
		}
	}
}
