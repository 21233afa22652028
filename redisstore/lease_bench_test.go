package redisstore_test

import (
	"context"
	"testing"
	"time"

	"github.com/floodgate/floodgate"
	"github.com/floodgate/floodgate/internal/redistest"
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
