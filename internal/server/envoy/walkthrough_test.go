package envoy_test

import (
	"bufio"
	"context"
	"log/slog"
	"os"
	"slices"
	"strings"
	"testing"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/encoding/protojson"

	"github.com/floodgate/floodgate"
	"github.com/floodgate/floodgate/internal/server/config"
	"github.com/floodgate/floodgate/internal/server/envoy"
	"github.com/floodgate/floodgate/internal/server/service"
	"github.com/floodgate/floodgate/internal/testkit/envoytest"
	"github.com/floodgate/floodgate/internal/testkit/redistest"
	"github.com/floodgate/floodgate/redisstore"
)

// TestWalkthrough loads examples/envoy's configuration and sends the
// requests of its walk-through over gRPC, in order, to a fresh floodgate
// on the embedded store and on a redis-server: each answer must be the
// one the walk-through shows, but for the value of durationUntilReset,
// which depends on the time; and each counter it shows must be on
// /metrics, whole line for whole line.
func TestWalkthrough(t *testing.T) {
	for _, tc := range []struct {
		name  string
		store func(t *testing.T) floodgate.Store
	}{
		{"memory", func(t *testing.T) floodgate.Store {
			st := floodgate.NewMemoryStore(&floodgate.MemoryOptions{SweepInterval: -1})
			t.Cleanup(func() { st.Close() })
			return st
		}},
		{"redis", func(t *testing.T) floodgate.Store {
			srv := redistest.Start(t)
			st, err := redisstore.NewFromURL(srv.URL(), nil)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { st.Close() })
			return st
		}},
	} {
		t.Run(tc.name, func(t *testing.T) { walkthrough(t, tc.store(t)) })
	}
}

// walkthroughMetrics is every ratelimit_service series the walk-through
// leaves, and its value. The login bucket's burst (3) is below its
// requests_per_unit (5): its near and over counts are measured against
// the burst, and over_limit was once uint64(-1). The 25 hits over the
// window of 20 count as over it, all of them (see decided).
var walkthroughMetrics = []string{
	`ratelimit_service_rate_limit_total_hits{domain="edge",key1="path_/api/*",key2=""} 2`,
	`ratelimit_service_rate_limit_total_hits{domain="edge",key1="path_/login",key2="remote_address"} 4`,
	`ratelimit_service_rate_limit_total_hits{domain="edge",key1="remote_address",key2=""} 26`,
	`ratelimit_service_rate_limit_over_limit{domain="edge",key1="path_/login",key2="remote_address"} 1`,
	`ratelimit_service_rate_limit_over_limit{domain="edge",key1="remote_address",key2=""} 25`,
	`ratelimit_service_rate_limit_near_limit{domain="edge",key1="path_/login",key2="remote_address"} 1`,
	`ratelimit_service_rate_limit_within_limit{domain="edge",key1="path_/api/*",key2=""} 2`,
	`ratelimit_service_rate_limit_within_limit{domain="edge",key1="path_/login",key2="remote_address"} 3`,
	`ratelimit_service_rate_limit_within_limit{domain="edge",key1="remote_address",key2=""} 1`,
}

func walkthrough(t *testing.T, st floodgate.Store) {
	cfg, err := config.Load("../../../examples/envoy/config")
	if err != nil {
		t.Fatal(err)
	}
	svc, err := envoy.New(st, cfg, &service.Options{Logger: slog.New(slog.DiscardHandler)}, nil)
	if err != nil {
		t.Fatal(err)
	}
	addr, _ := startGRPC(t, svc)
	c := envoytest.Client(t, addr)

	f, err := os.Open("../../../examples/envoy/README.md")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 1<<20)
	steps := 0
	var shown []string // the README's metrics lines
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, "ratelimit_service_") {
			shown = append(shown, line)
			continue
		}
		if !strings.HasPrefix(line, "$ curl") {
			continue
		}
		body := line[strings.Index(line, "-d '")+4 : len(line)-1]
		if !sc.Scan() {
			t.Fatalf("no answer after %s", line)
		}
		var req rlsv3.RateLimitRequest
		var want rlsv3.RateLimitResponse
		if err := protojson.Unmarshal([]byte(body), &req); err != nil {
			t.Fatalf("%s: %v", body, err)
		}
		if err := protojson.Unmarshal([]byte(sc.Text()), &want); err != nil {
			t.Fatalf("%s: %v", sc.Text(), err)
		}
		got, err := c.ShouldRateLimit(context.Background(), &req)
		if err != nil {
			t.Fatal(err)
		}
		if g, w := timeless(got), timeless(&want); g != w {
			t.Errorf("%s:\n got %s\nwant %s", body, g, w)
		}
		steps++
	}
	if steps < 5 || len(shown) < 2 {
		t.Fatalf("the walk-through has %d requests and %d counters; the test reads it wrong", steps, len(shown))
	}
	// The counters, whole lines: "...} 1" is a prefix of "...} 18446744073709551615".
	var m strings.Builder
	svc.Rules().Metrics.Write(&m)
	var series []string
	for _, line := range strings.Split(m.String(), "\n") {
		if strings.HasPrefix(line, "ratelimit_service_") {
			series = append(series, line)
		}
	}
	for _, want := range shown {
		if !slices.Contains(series, want) {
			t.Errorf("the README shows %s; /metrics lacks it", want)
		}
	}
	if !slices.Equal(series, walkthroughMetrics) {
		t.Errorf("/metrics has\n%s\nwant\n%s", strings.Join(series, "\n"), strings.Join(walkthroughMetrics, "\n"))
	}
}

// timeless is the answer in JSON with durationUntilReset's value hidden.
func timeless(r *rlsv3.RateLimitResponse) string {
	for _, s := range r.Statuses {
		if s.DurationUntilReset != nil {
			s.DurationUntilReset.Seconds = 1
		}
	}
	return protojson.Format(r)
}
