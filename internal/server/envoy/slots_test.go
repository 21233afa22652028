package envoy_test

import (
	"context"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/floodgate/floodgate"
	"github.com/floodgate/floodgate/internal/testkit/envoytest"
	"github.com/floodgate/floodgate/storetest"
)

const slotDomain = `domain: api
descriptors:
  - key: api_key
    concurrency: {slots: 2, lease: 60s}
  - key: path
    rate_limit: {unit: hour, requests_per_unit: 1}
`

// TestEnvoyConcurrency sends, over gRPC, exactly what Envoy sends for a
// route whose rate_limits are the request-time actions
// [request_headers x-api-key -> api_key, request_headers x-request-id ->
// floodgate_permit] and the same with apply_on_stream_done and a
// generic_key floodgate_release: the request-time call acquires, the
// stream-done call releases, a request with no stream-done call frees
// its slot at the lease's end.
func TestEnvoyConcurrency(t *testing.T) {
	clock := storetest.NewClock(storetest.Base)
	st := floodgate.NewMemoryStore(&floodgate.MemoryOptions{Clock: clock, SweepInterval: -1})
	t.Cleanup(func() { st.Close() })
	svc := newEnvoyOn(t, st, "api.yaml", slotDomain, nil)
	addr, _ := startGRPC(t, svc)
	c := envoytest.Client(t, addr)
	ctx := context.Background()
	start := func(requestID string, extra ...string) rlsv3.RateLimitResponse_Code {
		t.Helper()
		ds := []string{"api_key", "k1", "floodgate_permit", requestID}
		req := envoytest.Request("api", envoytest.Descriptor(ds...))
		if len(extra) > 0 {
			req.Descriptors = append(req.Descriptors, envoytest.Descriptor(extra...))
		}
		resp, err := c.ShouldRateLimit(ctx, req)
		if err != nil {
			t.Fatal(err)
		}
		return resp.OverallCode
	}
	done := func(requestID string) {
		t.Helper()
		resp, err := c.ShouldRateLimit(ctx, envoytest.Request("api",
			envoytest.Descriptor("api_key", "k1", "floodgate_permit", requestID, "floodgate_release", "1")))
		if err != nil || resp.OverallCode != rlsv3.RateLimitResponse_OK {
			t.Fatalf("stream done: %v %v", resp, err)
		}
	}
	const ok, over = rlsv3.RateLimitResponse_OK, rlsv3.RateLimitResponse_OVER_LIMIT
	for _, step := range []struct {
		name string
		do   func() rlsv3.RateLimitResponse_Code
		want rlsv3.RateLimitResponse_Code
	}{
		{"first stream", func() rlsv3.RateLimitResponse_Code { return start("req-1") }, ok},
		{"second stream", func() rlsv3.RateLimitResponse_Code { return start("req-2") }, ok},
		{"third stream, full", func() rlsv3.RateLimitResponse_Code { return start("req-3") }, over},
		// A request id in use already (a client that chose x-request-id)
		// holds no second slot, whether or not the key is full.
		{"second stream's id again, full", func() rlsv3.RateLimitResponse_Code { return start("req-2") }, over},
		{"first done, third again", func() rlsv3.RateLimitResponse_Code { done("req-1"); return start("req-3") }, ok},
		{"first done twice changes nothing", func() rlsv3.RateLimitResponse_Code { done("req-1"); return start("req-4") }, over},
		{"another key", func() rlsv3.RateLimitResponse_Code {
			resp, err := c.ShouldRateLimit(ctx, envoytest.Request("api", envoytest.Descriptor("api_key", "k2", "floodgate_permit", "x")))
			if err != nil {
				t.Fatal(err)
			}
			return resp.OverallCode
		}, ok},
		{"third stream's id again, room", func() rlsv3.RateLimitResponse_Code {
			resp, err := c.ShouldRateLimit(ctx, envoytest.Request("api", envoytest.Descriptor("api_key", "k2", "floodgate_permit", "x")))
			if err != nil {
				t.Fatal(err)
			}
			return resp.OverallCode
		}, over},
		{"2 and 3 done", func() rlsv3.RateLimitResponse_Code { done("req-2"); done("req-3"); return start("req-5") }, ok},
		// A rate descriptor over its limit gives the slot back.
		{"with a rate limit", func() rlsv3.RateLimitResponse_Code { return start("req-6", "path", "/x") }, ok},
		{"rate limit over", func() rlsv3.RateLimitResponse_Code { done("req-6"); return start("req-7", "path", "/x") }, over},
		{"req-7's slot was given back", func() rlsv3.RateLimitResponse_Code { return start("req-8") }, ok},
		// No stream-done call for 5, 8: their slots free at the lease's end.
		{"59s later", func() rlsv3.RateLimitResponse_Code { clock.Advance(59 * time.Second); return start("req-9") }, over},
		{"60s later", func() rlsv3.RateLimitResponse_Code { clock.Advance(time.Second); return start("req-9") }, ok},
	} {
		if got := step.do(); got != step.want {
			t.Fatalf("%s: %v, want %v", step.name, got, step.want)
		}
	}
}
