package envoy_test

import (
	"context"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"testing"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rls "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/floodgate/floodgate"
	"github.com/floodgate/floodgate/internal/server/config"
	"github.com/floodgate/floodgate/internal/server/envoy"
	"github.com/floodgate/floodgate/internal/server/service"
	"github.com/floodgate/floodgate/internal/testkit/envoytest"
	"github.com/floodgate/floodgate/storetest"
)

// FuzzEnvoyCounts sends a sequence of requests to a descriptor whose
// algorithm's burst is below its requests_per_unit, and checks
// envoyproxy/ratelimit's counters after it: none holds more than the
// hits, no hit is both within and over the limit, and every denial
// counts over it. A burst below the
// quota made over_limit uint64(-1) (the walk-through of examples/envoy).
//
// Each byte of steps is one request: its low 3 bits the hits (0 peeks),
// the rest how many tenths of a second pass before it.
func FuzzEnvoyCounts(f *testing.F) {
	f.Add(uint8(5), uint8(3), uint8(0), false, []byte{1, 1, 1, 1})
	f.Add(uint8(20), uint8(1), uint8(1), true, []byte{7, 7, 0x81, 2})
	f.Add(uint8(9), uint8(2), uint8(2), false, []byte{3, 0, 4, 0xf1, 1, 1})
	f.Fuzz(func(t *testing.T, rpu, burst, alg uint8, shadow bool, steps []byte) {
		if rpu < 2 || len(steps) > 64 {
			return
		}
		burst = 1 + burst%(rpu-1) // from 1 to rpu-1
		algorithm := []string{"token-bucket", "leaky-bucket", "gcra"}[int(alg)%3]
		domain := fmt.Sprintf(`domain: f
descriptors:
  - key: k
    shadow_mode: %t
    rate_limit: {unit: second, requests_per_unit: %d, algorithm: %s, burst: %d}
`, shadow, rpu, algorithm, burst)
		cfg, err := config.Parse("f.yaml", []byte(domain))
		if err != nil {
			t.Fatal(err)
		}
		clock := storetest.NewClock(storetest.Base)
		st := floodgate.NewMemoryStore(&floodgate.MemoryOptions{Clock: clock, SweepInterval: -1})
		defer st.Close()
		svc, err := envoy.New(st, cfg, &service.Options{Logger: slog.New(slog.DiscardHandler)}, &envoy.Options{Now: clock.Now})
		if err != nil {
			t.Fatal(err)
		}
		total, denials := uint64(0), uint64(0)
		for _, b := range steps {
			clock.Advance(time.Duration(b>>3) * 100 * time.Millisecond)
			d := envoytest.Descriptor("k", "v")
			d.HitsAddend = wrapperspb.UInt64(uint64(b & 7))
			resp, err := svc.ShouldRateLimit(context.Background(), &rls.RateLimitRequest{Domain: "f", Descriptors: []*rlcommon.RateLimitDescriptor{d}})
			if err != nil {
				t.Fatal(err)
			}
			if resp.OverallCode == rls.RateLimitResponse_OVER_LIMIT {
				denials++
			}
			total += uint64(b & 7)
		}
		c := envoyCounters(t, svc)
		if c["total_hits"] != total || c["within_limit"]+c["over_limit"] > total || c["over_limit"] < denials || c["shadow_mode"] > c["over_limit"] {
			t.Errorf("%s: counters %v after %d hits and %d denials", domain, c, total, denials)
		}
		for name, v := range c {
			if v > total {
				t.Errorf("%s: %s is %d, more than the %d hits", domain, name, v, total)
			}
		}
	})
}

// envoyCounters reads the ratelimit_service_rate_limit_* counters of a
// domain of one descriptor from /metrics, by their last name part.
func envoyCounters(t *testing.T, svc *envoy.Service) map[string]uint64 {
	t.Helper()
	var m strings.Builder
	svc.Rules().Metrics.Write(&m)
	out := map[string]uint64{}
	for _, line := range strings.Split(m.String(), "\n") {
		name, rest, ok := strings.Cut(line, "{")
		if !ok || !strings.HasPrefix(name, "ratelimit_service_rate_limit_") {
			continue
		}
		_, value, _ := strings.Cut(rest, "} ")
		v, err := strconv.ParseUint(value, 10, 64)
		if err != nil {
			t.Fatalf("%s: %v", line, err)
		}
		out[strings.TrimPrefix(name, "ratelimit_service_rate_limit_")] += v
	}
	return out
}
