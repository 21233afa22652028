package redisstore_test

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/floodgate/floodgate"
	"github.com/floodgate/floodgate/internal/redistest"
	"github.com/floodgate/floodgate/redisstore"
	"github.com/redis/go-redis/v9"
)

// BenchmarkOverride measures what an override costs a decision: one
// caller, one key, on the fast path (a lone bucket, overridden by a lone
// bucket) and on decide.lua (two limits, overridden by two). redis-us/op
// is the Redis server's own time per script call, from INFO commandstats.
//
//	go test -run - -bench Override -count 5 ./redisstore
func BenchmarkOverride(b *testing.B) {
	srv := redistest.Start(b)
	client := srv.Client(b)
	ctx := context.Background()
	cases := []struct {
		name     string
		limits   []floodgate.Limit
		override []floodgate.Limit
	}{
		{"bucket", []floodgate.Limit{floodgate.TokenBucket(1e9, time.Second, 1e9)}, []floodgate.Limit{floodgate.TokenBucket(2e9, time.Second, 2e9)}},
		{"two-limits", []floodgate.Limit{floodgate.TokenBucket(1e9, time.Second, 1e9), floodgate.FixedWindow(5e11, time.Hour)},
			[]floodgate.Limit{floodgate.TokenBucket(2e9, time.Second, 2e9), floodgate.FixedWindow(1e12, time.Hour)}},
	}
	for _, c := range cases {
		for _, overridden := range []bool{false, true} {
			name := c.name + "/plain"
			if overridden {
				name = c.name + "/overridden"
			}
			b.Run(name, func(b *testing.B) {
				st := redisstore.New(client, &redisstore.Options{Prefix: "bo:", DisableBatching: true})
				defer st.Close()
				lim := limiter(b, st, c.limits...)
				if overridden {
					if err := lim.SetOverride(ctx, "k", floodgate.Override{Limits: c.override}, floodgate.Additive); err != nil {
						b.Fatal(err)
					}
				} else if err := lim.DeleteOverride(ctx, "k", floodgate.Additive); err != nil {
					b.Fatal(err)
				}
				client.ConfigResetStat(ctx)
				b.ResetTimer()
				for b.Loop() {
					if r, err := lim.Allow(ctx, "k"); err != nil || r.Overridden != overridden {
						b.Fatal(r, err)
					}
				}
				b.StopTimer()
				b.ReportMetric(scriptMicros(b, client), "redis-us/op")
			})
		}
	}
}

// scriptMicros returns the mean usec_per_call of the script and function
// calls since the last CONFIG RESETSTAT.
func scriptMicros(b *testing.B, client redis.UniversalClient) float64 {
	info, err := client.Info(context.Background(), "commandstats").Result()
	if err != nil {
		b.Fatal(err)
	}
	var calls, usec float64
	for _, line := range strings.Split(info, "\n") {
		if !strings.HasPrefix(line, "cmdstat_evalsha:") && !strings.HasPrefix(line, "cmdstat_fcall:") {
			continue
		}
		for _, f := range strings.Split(strings.TrimSpace(line[strings.Index(line, ":")+1:]), ",") {
			k, v, _ := strings.Cut(f, "=")
			x, _ := strconv.ParseFloat(v, 64)
			switch k {
			case "calls":
				calls += x
			case "usec":
				usec += x
			}
		}
	}
	if calls == 0 {
		return 0
	}
	return usec / calls
}
