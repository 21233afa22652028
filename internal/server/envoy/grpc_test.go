package envoy_test

import (
	"context"
	"log/slog"
	"net"
	"testing"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	"github.com/floodgate/floodgate"
	"github.com/floodgate/floodgate/internal/server/envoy"
	"github.com/floodgate/floodgate/internal/testkit/envoytest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// webDomain limits each ip to 1 request an hour.
const webDomain = "domain: web\ndescriptors:\n  - key: ip\n    rate_limit: {unit: hour, requests_per_unit: 1}\n"

// serve starts a gRPC server with the rate limit service on the memory
// store, and returns a connection to it.
func serve(t *testing.T) (*grpc.ClientConn, *envoy.Server) {
	t.Helper()
	st := floodgate.NewMemoryStore(&floodgate.MemoryOptions{SweepInterval: -1})
	t.Cleanup(func() { st.Close() })
	svc := newEnvoyOn(t, st, "web.yaml", webDomain, nil)
	addr, srv := startGRPC(t, svc)
	conn := envoytest.Dial(t, addr)
	return conn, srv
}

// startGRPC serves svc's rate limit service on a loopback port, with
// opts, until t ends, and returns its address.
func startGRPC(t *testing.T, svc *envoy.Service, opts ...grpc.ServerOption) (string, *envoy.Server) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gs := grpc.NewServer(opts...)
	srv := envoy.Register(gs, svc, slog.New(slog.DiscardHandler))
	done := make(chan struct{})
	go func() {
		defer close(done)
		gs.Serve(ln)
	}()
	t.Cleanup(func() {
		gs.Stop()
		<-done
	})
	return ln.Addr().String(), srv
}

func TestServer(t *testing.T) {
	conn, srv := serve(t)
	ctx := context.Background()
	c := rlsv3.NewRateLimitServiceClient(conn)
	req := envoytest.Request("web", envoytest.Descriptor("ip", "a"))
	for i, want := range []rlsv3.RateLimitResponse_Code{rlsv3.RateLimitResponse_OK, rlsv3.RateLimitResponse_OVER_LIMIT} {
		resp, err := c.ShouldRateLimit(ctx, req)
		if err != nil || resp.OverallCode != want {
			t.Fatalf("request %d: %v, %v; want %v", i, resp, err, want)
		}
	}
	// Bad input gets envoyproxy/ratelimit's status and message; other
	// callers carry on.
	for _, bad := range []*rlsv3.RateLimitRequest{{Descriptors: req.Descriptors}, {Domain: "web"}} {
		_, err := c.ShouldRateLimit(ctx, bad)
		if status.Code(err) != codes.Unknown {
			t.Errorf("%v: %v, want codes.Unknown", bad, err)
		}
	}
	h := healthpb.NewHealthClient(conn)
	for _, name := range []string{"", "envoy.service.ratelimit.v3.RateLimitService"} {
		r, err := h.Check(ctx, &healthpb.HealthCheckRequest{Service: name})
		if err != nil || r.Status != healthpb.HealthCheckResponse_SERVING {
			t.Errorf("health of %q: %v, %v", name, r, err)
		}
	}
	srv.Shutdown()
	if r, err := h.Check(ctx, &healthpb.HealthCheckRequest{}); err != nil || r.Status != healthpb.HealthCheckResponse_NOT_SERVING {
		t.Errorf("health after Shutdown: %v, %v", r, err)
	}
}
