package main

import (
	"context"
	"encoding/hex"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	commonpb "go.opentelemetry.io/proto/otlp/common/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/proto"

	"github.com/floodgate/floodgate/internal/testkit/envoytest"
	"github.com/floodgate/floodgate/internal/testkit/redistest"
)

// receiver is an OTLP trace receiver on loopback: OpenTelemetry's
// collector service over gRPC, or its HTTP form (POST /v1/traces, a
// protobuf body).
type receiver struct {
	coltracepb.UnimplementedTraceServiceServer
	mu       sync.Mutex
	spans    []*tracepb.Span
	services []string // service.name of each span's resource
}

func (r *receiver) Export(_ context.Context, req *coltracepb.ExportTraceServiceRequest) (*coltracepb.ExportTraceServiceResponse, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, rs := range req.ResourceSpans {
		service := attr(rs.GetResource().GetAttributes(), "service.name").GetStringValue()
		for _, ss := range rs.ScopeSpans {
			for _, s := range ss.Spans {
				r.spans = append(r.spans, s)
				r.services = append(r.services, service)
			}
		}
	}
	return &coltracepb.ExportTraceServiceResponse{}, nil
}

// startReceiver starts a receiver speaking protocol (grpc or
// http/protobuf) and returns it and its base URL.
func startReceiver(t *testing.T, protocol string) (*receiver, string) {
	t.Helper()
	r := &receiver{}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	if protocol == "grpc" {
		gs := grpc.NewServer()
		coltracepb.RegisterTraceServiceServer(gs, r)
		go gs.Serve(ln)
		t.Cleanup(gs.Stop)
	} else {
		mux := http.NewServeMux()
		mux.HandleFunc("POST /v1/traces", func(w http.ResponseWriter, req *http.Request) {
			b, err := io.ReadAll(req.Body)
			var in coltracepb.ExportTraceServiceRequest
			if err == nil {
				err = proto.Unmarshal(b, &in)
			}
			if err != nil || req.Header.Get("Content-Type") != "application/x-protobuf" {
				http.Error(w, "bad request", http.StatusBadRequest)
				return
			}
			out, _ := r.Export(req.Context(), &in)
			b, _ = proto.Marshal(out)
			w.Header().Set("Content-Type", "application/x-protobuf")
			w.Write(b)
		})
		hs := &http.Server{Handler: mux}
		go hs.Serve(ln)
		t.Cleanup(func() { hs.Close() })
	}
	return r, "http://" + ln.Addr().String()
}

// trace returns the spans received of the trace id (hex), by name, and
// the service names they came with.
func (r *receiver) trace(id string) (map[string]*tracepb.Span, []string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := map[string]*tracepb.Span{}
	var services []string
	for i, s := range r.spans {
		if hex.EncodeToString(s.TraceId) == id {
			out[s.Name] = s
			services = append(services, r.services[i])
		}
	}
	return out, services
}

func (r *receiver) named(name string) []*tracepb.Span {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []*tracepb.Span
	for _, s := range r.spans {
		if s.Name == name {
			out = append(out, s)
		}
	}
	return out
}

func attr(kvs []*commonpb.KeyValue, key string) *commonpb.AnyValue {
	for _, kv := range kvs {
		if kv.Key == key {
			return kv.Value
		}
	}
	return nil
}

// anyString is v as text, whatever its kind, "" for none.
func anyString(v *commonpb.AnyValue) string {
	switch x := v.GetValue().(type) {
	case *commonpb.AnyValue_StringValue:
		return x.StringValue
	case *commonpb.AnyValue_IntValue:
		return strconv.FormatInt(x.IntValue, 10)
	case *commonpb.AnyValue_BoolValue:
		if x.BoolValue {
			return "true"
		}
		return "false"
	}
	return ""
}

// TestTraceOTLP: floodgate serve, on Redis, with tracing set by the
// standard OTEL_* variables, sends the spans of a check to an OTLP
// receiver that the test runs, over gRPC and over HTTP. A check over
// HTTP, a forward auth request and an Envoy gRPC call each join the
// trace of their caller's traceparent: the server span is a child of
// the caller's span, the check's a child of it, and the Redis call's
// a child of the check's. The sampler follows the caller: a request
// without a traceparent, with the ratio at 0, is not traced. A reload
// is a trace of its own.
func TestTraceOTLP(t *testing.T) {
	dir := t.TempDir()
	writeFile(t, filepath.Join(dir, "rules.yaml"), "rules:\n  - name: api\n    algorithm: token-bucket\n    rate: 1\n    period: 1h\n    burst: 1\n")
	writeFile(t, filepath.Join(dir, "edge.yaml"), "domain: edge\ndescriptors:\n  - key: user\n    rate_limit: {unit: hour, requests_per_unit: 5}\n")
	for _, protocol := range []string{"grpc", "http/protobuf"} {
		t.Run(strings.ReplaceAll(protocol, "/", "-"), func(t *testing.T) {
			redis := redistest.Start(t)
			rec, url := startReceiver(t, protocol)
			for k, v := range map[string]string{
				"OTEL_EXPORTER_OTLP_ENDPOINT": url, "OTEL_EXPORTER_OTLP_PROTOCOL": protocol,
				"OTEL_SERVICE_NAME": "edge-limiter", "OTEL_BSP_SCHEDULE_DELAY": "50",
				"OTEL_TRACES_SAMPLER": "parentbased_always_on",
			} {
				t.Setenv(k, v)
			}
			in := serve(t, "--redis", redis.URL()+"/0", "--config", dir, "--grpc", "127.0.0.1:0", "--watch", "0", "--budget", "2s")
			const parent = "00f067aa0ba902b7"
			traceparent := func(id string) string { return "00-" + id + "-" + parent + "-01" }
			check, auth, envoy := strings.Repeat("a1", 16), strings.Repeat("b2", 16), strings.Repeat("c3", 16)

			// Not traced: the caller did not sample it.
			in.post(t, "/v1/check", `{"rule":"api","key":"carol"}`, "traceparent", "00-"+strings.Repeat("d4", 16)+"-"+parent+"-00")
			if code, body := in.post(t, "/v1/check", `{"rule":"api","key":"alice"}`, "traceparent", traceparent(check)); code != 200 || body["allowed"] != true {
				t.Fatalf("check: %d %v", code, body)
			}
			if code, _ := in.get(t, "/v1/auth/api?key=bob", "traceparent", traceparent(auth)); code != 200 {
				t.Fatalf("forward auth: %d", code)
			}
			ctx := metadata.AppendToOutgoingContext(context.Background(), "traceparent", traceparent(envoy))
			resp, err := envoytest.Client(t, in.grpcAddr).ShouldRateLimit(ctx, envoytest.Request("edge", envoytest.Descriptor("user", "dave")))
			if err != nil || resp.OverallCode != rlsv3.RateLimitResponse_OK {
				t.Fatalf("ShouldRateLimit: %v, %v", resp, err)
			}
			in.cmd.Process.Signal(syscall.SIGHUP) // a reload

			tests := []struct {
				trace, server, decision, rule string
			}{
				{check, "POST /v1/check", "floodgate.check", "api"},
				{auth, "GET /v1/auth/{rule}", "floodgate.check", "api"},
				{envoy, "envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit", "floodgate.group", "envoy:edge"},
			}
			for _, tt := range tests {
				var spans map[string]*tracepb.Span
				var services []string
				waitFor(t, "the spans of "+tt.server, func() bool {
					spans, services = rec.trace(tt.trace)
					return spans[tt.server] != nil && spans[tt.decision] != nil && spans["floodgate.redis"] != nil
				})
				srv, dec, rs := spans[tt.server], spans[tt.decision], spans["floodgate.redis"]
				if hex.EncodeToString(srv.ParentSpanId) != parent || srv.Kind != tracepb.Span_SPAN_KIND_SERVER {
					t.Errorf("%s: parent %x, kind %v; want the caller's %s, server", tt.server, srv.ParentSpanId, srv.Kind, parent)
				}
				if string(dec.ParentSpanId) != string(srv.SpanId) || string(rs.ParentSpanId) != string(dec.SpanId) {
					t.Errorf("%s: the spans do not nest: server %x, %s %x (parent %x), floodgate.redis parent %x",
						tt.server, srv.SpanId, tt.decision, dec.SpanId, dec.ParentSpanId, rs.ParentSpanId)
				}
				for k, want := range map[string]string{"floodgate.rule": tt.rule, "floodgate.outcome": "allowed", "floodgate.source": "store", "floodgate.overridden": "false"} {
					if got := anyString(attr(dec.Attributes, k)); got != want {
						t.Errorf("%s: %s = %q, want %q", tt.decision, k, got, want)
					}
				}
				if attr(dec.Attributes, "floodgate.key") != nil {
					t.Errorf("%s records the key without --trace-keys", tt.decision)
				}
				if got := anyString(attr(rs.Attributes, "db.system.name")); got != "redis" {
					t.Errorf("floodgate.redis: db.system.name = %q", got)
				}
				if got := anyString(attr(rs.Attributes, "floodgate.redis.script_calls")); got != "1" {
					t.Errorf("floodgate.redis: script_calls = %q, want 1", got)
				}
				for _, s := range services {
					if s != "edge-limiter" {
						t.Errorf("service.name %q, want $OTEL_SERVICE_NAME's", s)
					}
				}
			}
			waitFor(t, "the reload's span", func() bool { return len(rec.named("floodgate.reload")) > 0 })
			if r := rec.named("floodgate.reload")[0]; len(r.ParentSpanId) != 0 || anyString(attr(r.Attributes, "floodgate.config.rules")) != "1" {
				t.Errorf("floodgate.reload: parent %x, rules %v; want a root, 1", r.ParentSpanId, attr(r.Attributes, "floodgate.config.rules"))
			}
			rec.mu.Lock()
			for _, s := range rec.spans {
				if id := hex.EncodeToString(s.TraceId); id != check && id != auth && id != envoy && s.Name != "floodgate.reload" {
					t.Errorf("span %q of trace %s, which no sampled caller started", s.Name, id)
				}
			}
			rec.mu.Unlock()
		})
	}
}
