package envoy_test

import (
	"context"
	"fmt"
	"testing"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rls "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/floodgate/floodgate"
	"github.com/floodgate/floodgate/internal/testkit/envoytest"
	"github.com/floodgate/floodgate/internal/testkit/redistest"
	"github.com/floodgate/floodgate/redisstore"
)

// BenchmarkShouldRateLimit is one Envoy request through the service on the
// memory store: the descriptors' lookup, their decisions (side by side
// for three), the answer and the metrics.
func BenchmarkShouldRateLimit(b *testing.B) {
	st := floodgate.NewMemoryStore(&floodgate.MemoryOptions{SweepInterval: -1})
	defer st.Close()
	svc := newEnvoyOn(b, st, "web.yaml", envoyDomain, nil)
	ctx := context.Background()
	for _, n := range []int{1, 3} {
		req := &rls.RateLimitRequest{Domain: "web"}
		for i := range n {
			req.Descriptors = append(req.Descriptors, envoytest.Descriptor("ip", string(rune('a'+i))))
		}
		b.Run(fmt.Sprintf("descriptors=%d", n), func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, err := svc.ShouldRateLimit(ctx, req); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkShouldRateLimitRedis is one Envoy request of three descriptors
// through the service on a redis-server of its own, from 64 goroutines, as
// rlsbench's busiest cell sends them without the gRPC layer: one script
// call per request, batched with the others in flight. Its allocations
// per request are floodgate's own (the requests are made beforehand).
func BenchmarkShouldRateLimitRedis(b *testing.B) {
	const domain = `domain: bench
descriptors:
  - key: remote_address
    rate_limit: {unit: second, requests_per_unit: 50}
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 1000}
  - key: path
    rate_limit: {unit: second, requests_per_unit: 5000}
`
	st := redisstore.New(redistest.Start(b).Client(b), nil)
	defer st.Close()
	svc := newEnvoyOn(b, st, "bench.yaml", domain, nil)
	reqs := make([]*rls.RateLimitRequest, 1000)
	for i := range reqs {
		ip := fmt.Sprint(i)
		reqs[i] = &rls.RateLimitRequest{Domain: "bench", Descriptors: []*rlcommon.RateLimitDescriptor{
			envoytest.Descriptor("remote_address", ip), envoytest.Descriptor("user", "u"+ip), envoytest.Descriptor("path", "/p")}}
	}
	ctx := context.Background()
	b.ReportAllocs()
	b.SetParallelism(32)
	b.RunParallel(func(pb *testing.PB) {
		for i := 0; pb.Next(); i++ {
			if _, err := svc.ShouldRateLimit(ctx, reqs[i%len(reqs)]); err != nil {
				b.Error(err)
				return
			}
		}
	})
}
