package redisstore_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/floodgate/floodgate"
	"github.com/floodgate/floodgate/internal/testkit/redistest"
	"github.com/floodgate/floodgate/redisstore"
)

// BenchmarkBatchDecide is 64 goroutines (32 per processor, on two)
// deciding on 10,000 keys through the batcher: a lone bucket (the fast
// path), a bucket and a fixed window (decide.lua, no sliding log) and a
// sliding log of MaxLogQuota, whose script calls carry only as much log
// work as the batcher's budget allows; and a lone bucket on one hot key,
// whose batches name that key once per request (bucket-hot).
// decisions/call is the mean batch,
// and redis-us/decision the Redis server's own time in script calls per
// decision (INFO commandstats).
//
//	go test -run - -bench BatchDecide -count 5 ./redisstore
func BenchmarkBatchDecide(b *testing.B) {
	srv := redistest.Start(b)
	const nkeys = 10000
	keys := make([]string, nkeys)
	for i := range keys {
		keys[i] = fmt.Sprintf("key%d", i)
	}
	for _, c := range []struct {
		name   string
		limits []floodgate.Limit
		nkeys  int // of keys, the first nkeys
	}{
		{"bucket", []floodgate.Limit{floodgate.TokenBucket(1_000_000, time.Second, 1_000_000_000)}, nkeys},
		{"bucket+window", []floodgate.Limit{floodgate.TokenBucket(1_000_000, time.Second, 1_000_000_000), floodgate.FixedWindow(1_000_000_000, time.Hour)}, nkeys},
		{"log", []floodgate.Limit{floodgate.SlidingLog(floodgate.MaxLogQuota, time.Millisecond)}, nkeys},
		{"bucket-hot", []floodgate.Limit{floodgate.TokenBucket(1_000_000, time.Second, 1_000_000_000)}, 1},
	} {
		b.Run(c.name, func(b *testing.B) {
			client := srv.Client(b)
			st := newStore(b, client, &redisstore.Options{Prefix: "bd:" + c.name + ":"})
			lim, err := floodgate.NewLimiter(st, c.limits, nil)
			if err != nil {
				b.Fatal(err)
			}
			ctx := context.Background()
			var started atomic.Int64
			client.ConfigResetStat(ctx)
			b.ReportAllocs()
			b.SetParallelism(32)
			b.RunParallel(func(pb *testing.PB) {
				i := int(started.Add(1)-1) * 997
				for pb.Next() {
					if _, err := lim.Allow(ctx, keys[i%c.nkeys]); err != nil {
						b.Errorf("Allow: %v", err)
						return
					}
					i++
				}
			})
			if s := st.Stats(); s.ScriptCalls > 0 {
				b.ReportMetric(float64(s.Decisions)/float64(s.ScriptCalls), "decisions/call")
				_, usec := commandStats(b, client, "evalsha", "fcall")
				b.ReportMetric(usec/float64(s.Decisions), "redis-us/decision")
			}
		})
	}
}
