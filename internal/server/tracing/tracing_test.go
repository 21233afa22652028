package tracing

import (
	"context"
	"net"
	"net/http"
	"net/http/httptest"
	"testing"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

const (
	traceID  = "4bf92f3577b34da6a3ce929d0e0e4736"
	parentID = "00f067aa0ba902b7"
)

func recorder(t *testing.T) (*tracetest.SpanRecorder, trace.TracerProvider) {
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	t.Cleanup(func() { tp.Shutdown(context.Background()) })
	return rec, tp
}

func attrsOf(s sdktrace.ReadOnlySpan) map[attribute.Key]string {
	m := map[attribute.Key]string{}
	for _, kv := range s.Attributes() {
		m[kv.Key] = kv.Value.String()
	}
	return m
}

// TestHTTP: an API request is a server span named after its route, a
// child of the traceparent's span, and the handler's context carries it;
// /metrics and the health checks are not traced; a 5xx is an error.
func TestHTTP(t *testing.T) {
	tests := []struct {
		method, path, traceparent string
		status                    int
		name                      string // "": not traced
		parent                    bool   // a child of the traceparent's span
	}{
		{"POST", "/v1/check", "00-" + traceID + "-" + parentID + "-01", 200, "POST /v1/check", true},
		{"GET", "/v1/auth/api", "00-" + traceID + "-" + parentID + "-01", 429, "GET /v1/auth/{rule}", true},
		{"POST", "/json", "", 503, "POST /json", false},
		{"POST", "/v1/check", "00-" + traceID + "-" + parentID + "-00", 200, "", false}, // the caller did not sample it
		{"GET", "/v1/no/such/long/path", "", 404, "GET /v1/", false},
		// Unknown paths and methods are any client's to vary: none names
		// a span, whose names must be few.
		{"GET", "/v1/x7f3a9", "", 404, "GET /v1/", false},
		{"GET", "/v1/no/such", "", 404, "GET /v1/", false},
		{"BREW", "/v1/check", "", 405, "HTTP /v1/check", false},
		{"POST", "/v1/check/batch", "", 200, "POST /v1/check/batch", false},
		{"POST", "/v1/explain/envoy", "", 200, "POST /v1/explain/envoy", false},
		{"GET", "/metrics", "00-" + traceID + "-" + parentID + "-01", 200, "", false},
		{"GET", "/healthz", "", 200, "", false},
		{"GET", "/v1/dashboard", "", 200, "", false},
	}
	for _, tt := range tests {
		t.Run(tt.method+" "+tt.path, func(t *testing.T) {
			rec, tp := recorder(t)
			var inner trace.SpanContext
			h := HTTP(tp, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				inner = trace.SpanContextFromContext(r.Context())
				w.WriteHeader(tt.status)
			}))
			req := httptest.NewRequest(tt.method, tt.path, nil)
			if tt.traceparent != "" {
				req.Header.Set("Traceparent", tt.traceparent)
			}
			w := httptest.NewRecorder()
			h.ServeHTTP(w, req)
			if w.Code != tt.status {
				t.Errorf("status %d, want %d", w.Code, tt.status)
			}
			spans := rec.Ended()
			if tt.name == "" {
				if len(spans) != 0 {
					t.Errorf("%d spans, want none", len(spans))
				}
				return
			}
			if len(spans) != 1 {
				t.Fatalf("%d spans, want 1", len(spans))
			}
			s := spans[0]
			if s.Name() != tt.name || s.SpanKind() != trace.SpanKindServer {
				t.Errorf("span %q, %v; want %q, server", s.Name(), s.SpanKind(), tt.name)
			}
			if inner.SpanID() != s.SpanContext().SpanID() {
				t.Errorf("the handler's context has span %v, want the server span's", inner.SpanID())
			}
			if got := s.Parent().SpanID().String() == parentID && s.SpanContext().TraceID().String() == traceID; got != tt.parent {
				t.Errorf("parent %v of trace %v; a child of the traceparent: %v", s.Parent().SpanID(), s.SpanContext().TraceID(), tt.parent)
			}
			a := attrsOf(s)
			if a["http.response.status_code"] != itoa(tt.status) || a["http.request.method"] != tt.method {
				t.Errorf("attributes %v", a)
			}
			if (s.Status().Code == codes.Error) != (tt.status >= 500) {
				t.Errorf("status %v for %d", s.Status(), tt.status)
			}
		})
	}
}

func itoa(n int) string { return httpStatus(n) }

// TestGRPC: a call is a server span, a child of the traceparent in its
// metadata, with its domain; health checks are not traced.
func TestGRPC(t *testing.T) {
	rec, tp := recorder(t)
	gs := grpc.NewServer(GRPC(tp))
	hs := health.NewServer()
	healthpb.RegisterHealthServer(gs, hs)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go gs.Serve(ln)
	defer gs.Stop()
	conn, err := grpc.NewClient(ln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	c := healthpb.NewHealthClient(conn)
	ctx := metadata.AppendToOutgoingContext(context.Background(), "traceparent", "00-"+traceID+"-"+parentID+"-01")
	if _, err := c.Check(ctx, &healthpb.HealthCheckRequest{}); err != nil {
		t.Fatal(err)
	}
	if n := len(rec.Ended()); n != 0 {
		t.Fatalf("a health check made %d spans, want none", n)
	}

	// Any other method is traced: the interceptor, on a call it sees.
	var inner trace.SpanContext
	info := &grpc.UnaryServerInfo{FullMethod: "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit"}
	in := metadata.NewIncomingContext(context.Background(), metadata.Pairs("traceparent", "00-"+traceID+"-"+parentID+"-01"))
	interceptor := unaryOf(t, tp)
	_, err = interceptor(in, domainReq{"edge"}, info, func(ctx context.Context, req any) (any, error) {
		inner = trace.SpanContextFromContext(ctx)
		return nil, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	spans := rec.Ended()
	if len(spans) != 1 {
		t.Fatalf("%d spans, want 1", len(spans))
	}
	s := spans[0]
	if s.Name() != "envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit" || s.SpanKind() != trace.SpanKindServer ||
		s.Parent().SpanID().String() != parentID || s.SpanContext().TraceID().String() != traceID || inner.SpanID() != s.SpanContext().SpanID() {
		t.Errorf("span %q %v, parent %v, trace %v", s.Name(), s.SpanKind(), s.Parent().SpanID(), s.SpanContext().TraceID())
	}
	if a := attrsOf(s); a["floodgate.envoy.domain"] != "edge" || a["rpc.service"] != "envoy.service.ratelimit.v3.RateLimitService" || a["rpc.grpc.status_code"] != "0" {
		t.Errorf("attributes %v", a)
	}
}

type domainReq struct{ d string }

func (r domainReq) GetDomain() string { return r.d }

// unaryOf returns the interceptor that GRPC installs.
func unaryOf(t *testing.T, tp trace.TracerProvider) grpc.UnaryServerInterceptor {
	t.Helper()
	return unary(tp.Tracer(TracerName))
}
