package envoy_test

import (
	"context"
	"log/slog"
	"testing"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/floodgate/floodgate"
	"github.com/floodgate/floodgate/internal/server/config"
	"github.com/floodgate/floodgate/internal/server/envoy"
	"github.com/floodgate/floodgate/internal/server/service"
	"github.com/floodgate/floodgate/internal/testkit/envoytest"
)

// fuzzConfig is diffConfig with every feature (floodgate has them all)
// and the algorithms that only floodgate has.
var fuzzConfig = diffConfig(^feature(0)) + `  - key: bucket
    rate_limit: {unit: second, requests_per_unit: 10, algorithm: token-bucket, burst: 30}
  - key: log
    rate_limit: {unit: minute, unit_multiplier: 10, requests_per_unit: 4, algorithm: sliding-log}
`

// FuzzRLS decodes any bytes as a RateLimitRequest, as gRPC does with a
// call's message, and hands the request to the rate limit service's
// handler, with and without STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT: it
// answers codes.Unknown (bad input) or a status per descriptor whose
// overall code is OVER_LIMIT exactly when one of them is; never a panic
// or another error.
//
//	go test -run '^$' -fuzz '^FuzzRLS$' -fuzztime 20000x ./internal/server/envoy
func FuzzRLS(f *testing.F) {
	limited := envoytest.Descriptor("open", "x")
	limited.Limit = &rlcommon.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 1, Unit: typev3.RateLimitUnit_YEAR}
	costly := envoytest.Descriptor("remote_address", "a")
	costly.HitsAddend = wrapperspb.UInt64(1 << 63)
	for _, req := range []*rlsv3.RateLimitRequest{
		{Domain: "diff", Descriptors: []*rlcommon.RateLimitDescriptor{envoytest.Descriptor("remote_address", "203.0.113.7")}},
		{Domain: "diff", Descriptors: []*rlcommon.RateLimitDescriptor{envoytest.Descriptor("message_type", "marketing", "to_number", "1"), envoytest.Descriptor("path", "/api/x"), envoytest.Descriptor("files", "/f/a")}, HitsAddend: 3},
		{Domain: "diff", Descriptors: []*rlcommon.RateLimitDescriptor{envoytest.Descriptor("tier", "low"), envoytest.Descriptor("tier", "high"), envoytest.Descriptor("shadow", "s"), envoytest.Descriptor("blocked", "b"), envoytest.Descriptor("free", "f")}},
		{Domain: "diff", Descriptors: []*rlcommon.RateLimitDescriptor{envoytest.Descriptor("bucket", "b"), envoytest.Descriptor("log", "l"), limited, costly}},
		{Domain: "other", Descriptors: []*rlcommon.RateLimitDescriptor{envoytest.Descriptor("k", "v")}},
		{Domain: "diff"},
		{Descriptors: []*rlcommon.RateLimitDescriptor{envoytest.Descriptor("k", "v")}},
	} {
		b, err := proto.Marshal(req)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b, false)
		f.Add(b, true)
	}
	cfg, err := config.Parse("diff.yaml", []byte(fuzzConfig))
	if err != nil {
		f.Fatal(err)
	}
	var servers [2]*envoy.Server
	for i, atomic := range []bool{false, true} {
		st := floodgate.NewMemoryStore(&floodgate.MemoryOptions{SweepInterval: -1})
		f.Cleanup(func() { st.Close() })
		svc, err := envoy.New(st, cfg, &service.Options{Logger: slog.New(slog.DiscardHandler)}, &envoy.Options{StopIncrementWhenOverLimit: atomic})
		if err != nil {
			f.Fatal(err)
		}
		// Registered on a server that never serves: the handler is called
		// directly, as gRPC calls it once the message is decoded.
		servers[i] = envoy.Register(grpc.NewServer(), svc, slog.New(slog.DiscardHandler))
	}
	f.Fuzz(func(t *testing.T, msg []byte, atomic bool) {
		var req rlsv3.RateLimitRequest
		if proto.Unmarshal(msg, &req) != nil {
			return // gRPC answers codes.Internal before the handler
		}
		srv := servers[0]
		if atomic {
			srv = servers[1]
		}
		resp, err := srv.ShouldRateLimit(context.Background(), &req)
		if err != nil {
			if status.Code(err) != codes.Unknown {
				t.Fatalf("%v: %v, want codes.Unknown or an answer", &req, err)
			}
			return
		}
		if len(resp.Statuses) != len(req.Descriptors) {
			t.Fatalf("%v: %d statuses for %d descriptors", &req, len(resp.Statuses), len(req.Descriptors))
		}
		over := false
		for i, st := range resp.Statuses {
			switch {
			case st == nil:
				t.Fatalf("%v: status %d is nil", &req, i)
			case st.Code == rlsv3.RateLimitResponse_OVER_LIMIT:
				over = true
				if st.CurrentLimit == nil {
					t.Fatalf("%v: status %d is OVER_LIMIT without a limit", &req, i)
				}
			case st.Code != rlsv3.RateLimitResponse_OK:
				t.Fatalf("%v: status %d is %v", &req, i, st.Code)
			}
		}
		if want := map[bool]rlsv3.RateLimitResponse_Code{false: rlsv3.RateLimitResponse_OK, true: rlsv3.RateLimitResponse_OVER_LIMIT}[over]; resp.OverallCode != want {
			t.Fatalf("%v: overall %v, want %v", &req, resp.OverallCode, want)
		}
		if _, err := proto.Marshal(resp); err != nil {
			t.Fatalf("%v: the answer does not marshal: %v", &req, err)
		}
	})
}
