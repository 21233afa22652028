package redisstore_test

import (
	"context"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/floodgate/floodgate"
	"github.com/floodgate/floodgate/internal/testkit/redistest"
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
		// A lone bucket overridden by a window: decide.lua's work, after
		// the first decision, in one call.
		{"bucket-to-window", []floodgate.Limit{floodgate.TokenBucket(1e9, time.Second, 1e9)}, []floodgate.Limit{floodgate.FixedWindow(1e12, time.Hour)}},
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
				us, calls := scriptStats(b, client)
				b.ReportMetric(us, "redis-us/call")
				b.ReportMetric(calls/float64(b.N), "calls/op")
			})
		}
	}
}

// scriptStats returns the mean usec_per_call of the script and function
// calls since the last CONFIG RESETSTAT, and how many there were.
func scriptStats(tb testing.TB, client redis.UniversalClient) (usecPerCall, calls float64) {
	calls, usec := commandStats(tb, client, "evalsha", "fcall")
	if calls == 0 {
		return 0, 0
	}
	return usec / calls, calls
}

// commandStats returns how many calls of the named commands (lower case)
// Redis made since the last CONFIG RESETSTAT, scripts' included, and the
// microseconds they took.
func commandStats(tb testing.TB, client redis.UniversalClient, names ...string) (calls, usec float64) {
	info, err := client.Info(context.Background(), "commandstats").Result()
	if err != nil {
		tb.Fatal(err)
	}
	for _, line := range strings.Split(info, "\n") {
		name, fields, ok := strings.Cut(strings.TrimSpace(line), ":")
		if !ok || !slices.Contains(names, strings.TrimPrefix(name, "cmdstat_")) {
			continue
		}
		for _, f := range strings.Split(fields, ",") {
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
	return calls, usec
}

// A lone bucket's key overridden by another algorithm goes to decide.lua
// once per process: every decision after the first is one script call.
func TestOverrideOfAnotherKindOneCall(t *testing.T) {
	srv := redistest.Start(t)
	client, admin := srv.Client(t), srv.Admin(t)
	ctx := context.Background()
	for _, batching := range []bool{false, true} {
		st := redisstore.New(client, &redisstore.Options{DisableBatching: !batching})
		defer st.Close()
		lim := limiter(t, st, floodgate.TokenBucket(100, time.Second, 100))
		if err := lim.SetOverride(ctx, "k", floodgate.Override{Limits: []floodgate.Limit{floodgate.FixedWindow(1000, time.Hour)}}, floodgate.Additive); err != nil {
			t.Fatal(err)
		}
		if _, err := lim.Allow(ctx, "k"); err != nil { // the fast path hands it over
			t.Fatal(err)
		}
		admin.ConfigResetStat(ctx)
		const n = 50
		for range n {
			if r, err := lim.Allow(ctx, "k"); err != nil || !r.Overridden || r.Quota != 1000 {
				t.Fatalf("Allow = %+v, %v; want the override's", r, err)
			}
		}
		if _, calls := scriptStats(t, client); calls != n {
			t.Errorf("batching %v: %v script calls for %d decisions, want one each", batching, calls, n)
		}
		// Back to a bucket: the fast path again.
		if err := lim.DeleteOverride(ctx, "k", floodgate.Additive); err != nil {
			t.Fatal(err)
		}
		for range 2 {
			if r, err := lim.Allow(ctx, "k"); err != nil || r.Overridden || r.Quota != 100 {
				t.Fatalf("Allow after the override went = %+v, %v", r, err)
			}
		}
		admin.ConfigResetStat(ctx)
		if _, err := lim.Allow(ctx, "k"); err != nil {
			t.Fatal(err)
		}
		if info := client.Info(ctx, "commandstats").Val(); !strings.Contains(info, "cmdstat_fcall:calls=1,") {
			t.Errorf("batching %v: the decision after the override went did not take the fast path:\n%s", batching, info)
		}
	}
}
