package grpclimit_test

import (
	"context"
	"log/slog"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/peer"

	"github.com/floodgate/floodgate"
	"github.com/floodgate/floodgate/core"
	"github.com/floodgate/floodgate/grpclimit"
	"github.com/floodgate/floodgate/internal/testkit/syncbuf"
	"github.com/floodgate/floodgate/storetest"
	"go.uber.org/goleak"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
)

// serve starts a real gRPC server on 127.0.0.1 with the health service and
// the given server options, and returns a client for it.
func serve(t *testing.T, sopts []grpc.ServerOption, copts ...grpc.DialOption) healthpb.HealthClient {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer(sopts...)
	healthpb.RegisterHealthServer(srv, health.NewServer())
	go srv.Serve(ln)
	t.Cleanup(srv.Stop)
	conn, err := grpc.NewClient(ln.Addr().String(), append(copts, grpc.WithTransportCredentials(insecure.NewCredentials()))...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return healthpb.NewHealthClient(conn)
}

func TestUnary(t *testing.T) {
	lim, clock := storetest.NewLimiter(t, floodgate.PerMinute(2).Named("per-minute"))
	client := serve(t, []grpc.ServerOption{grpc.UnaryInterceptor(grpclimit.UnaryServerInterceptor(lim, nil))})
	ctx := context.Background()
	steps := []struct {
		advance   time.Duration
		code      codes.Code
		rateLimit string
		retry     string
	}{
		{0, codes.OK, `"per-minute";r=1;t=30`, ""},
		{0, codes.OK, `"per-minute";r=0;t=60`, ""},
		{0, codes.ResourceExhausted, `"per-minute";r=0;t=30`, "30"},
		{30 * time.Second, codes.OK, `"per-minute";r=0;t=60`, ""},
	}
	for i, st := range steps {
		clock.Advance(st.advance)
		var hdr metadata.MD
		_, err := client.Check(ctx, &healthpb.HealthCheckRequest{}, grpc.Header(&hdr))
		if got := status.Code(err); got != st.code {
			t.Fatalf("step %d: code %v (%v), want %v", i, got, err, st.code)
		}
		if got := first(hdr, grpclimit.MDRateLimit); got != st.rateLimit {
			t.Errorf("step %d: ratelimit = %q, want %q", i, got, st.rateLimit)
		}
		if got := first(hdr, grpclimit.MDPolicy); got != `"per-minute";q=2;w=60` {
			t.Errorf("step %d: ratelimit-policy = %q", i, got)
		}
		if got := first(hdr, grpclimit.MDRetryAfter); got != st.retry {
			t.Errorf("step %d: retry-after = %q, want %q", i, got, st.retry)
		}
		if err == nil {
			continue
		}
		retry, quota := details(err)
		if retry == nil || retry.RetryDelay.AsDuration() != 30*time.Second {
			t.Errorf("step %d: RetryInfo = %v", i, retry)
		}
		if quota == nil || quota.Violations[0].Description != "per-minute" || quota.Violations[0].Subject != "ip:127.0.0.1" {
			t.Errorf("step %d: QuotaFailure = %v", i, quota)
		}
	}
}

// details returns the RetryInfo and QuotaFailure details of err's
// status, nil for one it lacks.
func details(err error) (retry *errdetails.RetryInfo, quota *errdetails.QuotaFailure) {
	for _, d := range status.Convert(err).Details() {
		switch d := d.(type) {
		case *errdetails.RetryInfo:
			retry = d
		case *errdetails.QuotaFailure:
			quota = d
		}
	}
	return retry, quota
}

func first(md metadata.MD, k string) string {
	if v := md.Get(k); len(v) > 0 {
		return v[0]
	}
	return ""
}

func TestStream(t *testing.T) {
	lim, _ := storetest.NewLimiter(t, floodgate.PerMinute(1))
	client := serve(t, []grpc.ServerOption{grpc.StreamInterceptor(grpclimit.StreamServerInterceptor(lim, nil))})
	for i, want := range []codes.Code{codes.OK, codes.ResourceExhausted} {
		ctx, cancel := context.WithCancel(context.Background())
		stream, err := client.Watch(ctx, &healthpb.HealthCheckRequest{})
		if err != nil {
			t.Fatal(err)
		}
		_, err = stream.Recv()
		if got := status.Code(err); got != want {
			t.Errorf("stream %d: code %v (%v), want %v", i, got, err, want)
		}
		hdr, _ := stream.Header()
		if first(hdr, grpclimit.MDRateLimit) == "" {
			t.Errorf("stream %d: no ratelimit metadata", i)
		}
		cancel()
	}
}

func TestKeysAndOptions(t *testing.T) {
	lim, _ := storetest.NewLimiter(t, floodgate.PerMinute(1))
	opts := &grpclimit.Options{
		Key:  grpclimit.Metadata("x-api-key", nil),
		Skip: func(ctx context.Context, method string) bool { return metadataValue(ctx, "skip") == "1" },
	}
	client := serve(t, []grpc.ServerOption{grpc.UnaryInterceptor(grpclimit.UnaryServerInterceptor(lim, opts))})
	call := func(kv ...string) codes.Code {
		ctx := metadata.AppendToOutgoingContext(context.Background(), kv...)
		_, err := client.Check(ctx, &healthpb.HealthCheckRequest{})
		return status.Code(err)
	}
	tests := []struct {
		md   []string
		want codes.Code
	}{
		{nil, codes.InvalidArgument}, // no key
		{[]string{"x-api-key", "a"}, codes.OK},
		{[]string{"x-api-key", "a"}, codes.ResourceExhausted},
		{[]string{"x-api-key", "b"}, codes.OK}, // another key
		{[]string{"x-api-key", "a", "skip", "1"}, codes.OK},
	}
	for i, tt := range tests {
		if got := call(tt.md...); got != tt.want {
			t.Errorf("call %d %v: %v, want %v", i, tt.md, got, tt.want)
		}
	}
}

func metadataValue(ctx context.Context, k string) string {
	md, _ := metadata.FromIncomingContext(ctx)
	if v := md.Get(k); len(v) > 0 {
		return v[0]
	}
	return ""
}

type failingStore struct {
	core.Store  // nil: the tests call only the methods below
	core.Policy // nil: the tests call only the methods below
}

func (f failingStore) Prepare([]core.Spec) (core.Policy, error) { return f, nil }
func (failingStore) Close() error                               { return nil }
func (failingStore) Take(context.Context, string, int64) (core.Decision, error) {
	return core.Decision{}, floodgate.ErrStore
}
func (failingStore) Reset(context.Context, string) error { return floodgate.ErrStore }

func TestStoreFailure(t *testing.T) {
	for _, tt := range []struct {
		failClosed bool
		want       codes.Code
	}{{false, codes.OK}, {true, codes.Unavailable}} {
		lim, _ := floodgate.NewLimiter(failingStore{}, []floodgate.Limit{floodgate.PerSecond(1)}, nil)
		var log syncbuf.Buffer
		client := serve(t, []grpc.ServerOption{grpc.UnaryInterceptor(grpclimit.UnaryServerInterceptor(lim, &grpclimit.Options{FailClosed: tt.failClosed, Logger: slog.New(slog.NewTextHandler(&log, nil))}))})
		// Every call fails the same way: the log says so a line a second,
		// not once a call.
		const calls = 50
		start := time.Now()
		for range calls {
			_, err := client.Check(context.Background(), &healthpb.HealthCheckRequest{})
			if got := status.Code(err); got != tt.want {
				t.Fatalf("FailClosed %v: %v, want %v", tt.failClosed, got, tt.want)
			}
		}
		secs := time.Since(start).Seconds()
		out := log.String()
		if n := strings.Count(out, "\n"); n < 1 || float64(n) > 1+secs {
			t.Errorf("FailClosed %v: %d calls in %.2fs logged %d lines, want one a second:\n%s", tt.failClosed, calls, secs, n, out)
		}
	}
}

// The client interceptor waits for capacity: with 1 call per second and a
// fixed clock that Wait advances, three calls take two seconds of clock.
func TestClientInterceptor(t *testing.T) {
	lim, clock := storetest.NewLimiter(t, floodgate.PerSecond(1))
	client := serve(t, nil,
		grpc.WithUnaryInterceptor(grpclimit.UnaryClientInterceptor(lim, &grpclimit.ClientOptions{Key: grpclimit.ByMethod()})),
		grpc.WithStreamInterceptor(grpclimit.StreamClientInterceptor(lim, nil)))
	for range 3 {
		if _, err := client.Check(context.Background(), &healthpb.HealthCheckRequest{}); err != nil {
			t.Fatal(err)
		}
	}
	if waited := clock.Now().Sub(storetest.Base); waited != 2*time.Second {
		t.Errorf("waited %s, want 2s", waited)
	}
	// A deadline that comes before capacity fails at once, unsent.
	// Context deadlines are real time, so the clock is set to it.
	clock.Set(time.Now())
	if _, err := client.Check(context.Background(), &healthpb.HealthCheckRequest{}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	_, err := client.Check(ctx, &healthpb.HealthCheckRequest{})
	if status.Code(err) != codes.DeadlineExceeded || !strings.Contains(err.Error(), floodgate.ErrDeadline.Error()) {
		t.Errorf("deadline before capacity: %v", err)
	}
	stream, err := client.Watch(context.Background(), &healthpb.HealthCheckRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := stream.Recv(); err != nil {
		t.Fatal(err)
	}
}

// A client key function that fails fails the call with InvalidArgument,
// unsent, on unary calls and streams alike, as the server's KeyFunc does.
func TestClientKeyError(t *testing.T) {
	lim, _ := storetest.NewLimiter(t, floodgate.PerSecond(1))
	fail := &grpclimit.ClientOptions{Key: grpclimit.Metadata("x-tenant", nil)} // no incoming metadata on a client
	client := serve(t, nil,
		grpc.WithUnaryInterceptor(grpclimit.UnaryClientInterceptor(lim, fail)),
		grpc.WithStreamInterceptor(grpclimit.StreamClientInterceptor(lim, fail)))
	if _, err := client.Check(context.Background(), &healthpb.HealthCheckRequest{}); status.Code(err) != codes.InvalidArgument {
		t.Errorf("unary call with a failing key: %v, want InvalidArgument", err)
	}
	if _, err := client.Watch(context.Background(), &healthpb.HealthCheckRequest{}); status.Code(err) != codes.InvalidArgument {
		t.Errorf("stream with a failing key: %v, want InvalidArgument", err)
	}
}

// No test leaves a goroutine behind.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestClientIP(t *testing.T) {
	trusted := []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")}
	xff, err := grpclimit.ClientIP("", trusted...)
	if err != nil {
		t.Fatal(err)
	}
	real, err := grpclimit.ClientIP("X-Real-IP", trusted...)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := grpclimit.ClientIP("x-client-ip", trusted...); err == nil {
		t.Error("ClientIP accepted a header no proxy standard writes")
	}
	tests := []struct {
		name string
		key  grpclimit.KeyFunc
		peer string
		md   []string
		want string
	}{
		{"untrusted peer", xff, "192.0.2.1:5000", []string{"x-forwarded-for", "198.51.100.7"}, "ip:192.0.2.1"},
		{"trusted peer", xff, "10.1.1.1:5000", []string{"x-forwarded-for", "6.6.6.6, 198.51.100.7"}, "ip:198.51.100.7"},
		{"forged forwarded ignored", xff, "10.1.1.1:5000", []string{"forwarded", "for=6.6.6.6", "x-forwarded-for", "198.51.100.7"}, "ip:198.51.100.7"},
		{"x-real-ip", real, "10.1.1.1:5000", []string{"x-real-ip", "198.51.100.9"}, "ip:198.51.100.9"},
		{"no metadata", real, "10.1.1.1:5000", nil, "ip:10.1.1.1"},
	}
	for _, tt := range tests {
		addr, _ := net.ResolveTCPAddr("tcp", tt.peer)
		ctx := peer.NewContext(context.Background(), &peer.Peer{Addr: addr})
		if tt.md != nil {
			ctx = metadata.NewIncomingContext(ctx, metadata.Pairs(tt.md...))
		}
		got, err := tt.key(ctx, "/m")
		if err != nil || got != tt.want {
			t.Errorf("%s: %q, %v; want %q", tt.name, got, err, tt.want)
		}
	}
}
