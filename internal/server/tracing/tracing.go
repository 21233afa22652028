// Package tracing joins floodgate serve's requests to their callers'
// traces: it takes the W3C trace context (traceparent, tracestate) from an
// HTTP request's headers or a gRPC call's metadata, and starts a server
// span under it, so that the decisions' spans (floodgate.check and those
// under it) belong to the caller's trace, and the log lines written while
// serving carry its trace id (see logctx). The Redis protocol has no
// headers: its decisions start traces of their own.
//
// Only the API's requests are traced: /v1/ and Envoy's /json over HTTP,
// and Envoy's ShouldRateLimit over gRPC, not /metrics, the health checks or
// the dashboard's page, which would fill a trace store with scrapes.
package tracing

import (
	"context"
	"net/http"
	"strings"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
)

// TracerName is the instrumentation scope of the server spans.
const TracerName = "github.com/floodgate/floodgate/serve"

// propagator reads W3C Trace Context, the only format taken: it is what
// Envoy, nginx's and Caddy's tracing and OpenTelemetry's SDKs send.
var propagator = propagation.TraceContext{}

// HTTP returns h with the API's requests traced by tp: each in a server
// span named after its method and route, a child of the caller's span
// when the request carries a valid traceparent.
func HTTP(tp trace.TracerProvider, h http.Handler) http.Handler {
	tracer := tp.Tracer(TracerName)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		route, ok := httpRoute(r.URL.Path)
		if !ok {
			h.ServeHTTP(w, r)
			return
		}
		ctx := propagator.Extract(r.Context(), propagation.HeaderCarrier(r.Header))
		ctx, span := tracer.Start(ctx, spanMethod(r.Method)+" "+route, trace.WithSpanKind(trace.SpanKindServer))
		defer span.End()
		sw := &statusWriter{ResponseWriter: w, status: http.StatusOK}
		h.ServeHTTP(sw, r.WithContext(ctx))
		if span.IsRecording() {
			span.SetAttributes(
				attribute.String("http.request.method", r.Method),
				attribute.String("http.route", route),
				attribute.String("url.path", r.URL.Path),
				attribute.Int("http.response.status_code", sw.status),
			)
			if sw.status >= 500 {
				// The conventions: a server span is an error on 5xx only;
				// 4xx is the client's.
				span.SetStatus(codes.Error, http.StatusText(sw.status))
				span.SetAttributes(attribute.String("error.type", httpStatus(sw.status)))
			}
		}
	})
}

// httpRoute returns the route of an API path, as a span's name and
// http.route have it, and false for a path that is not traced. A rule's
// name in /v1/auth/{rule} is left out of the name, which must be of few
// values.
func httpRoute(path string) (string, bool) {
	switch {
	case path == "/json":
		return path, true
	case strings.HasPrefix(path, "/v1/auth/"):
		return "/v1/auth/{rule}", true
	case strings.HasPrefix(path, "/v1/overrides/"):
		return "/v1/overrides/{rule}", true
	case path == "/v1/dashboard":
		return "", false // the dashboard's polling
	case apiRoutes[path]:
		return path, true
	case strings.HasPrefix(path, "/v1/"):
		return "/v1/", true // an unknown path: not its text, which any client can vary
	}
	return "", false
}

// apiRoutes are the API's paths (package httpapi's) that name their
// spans; any other path under /v1/ is "/v1/".
var apiRoutes = map[string]bool{
	"/v1/check": true, "/v1/check/batch": true, "/v1/reset": true, "/v1/settle": true,
	"/v1/rules": true, "/v1/inspect": true, "/v1/explain": true, "/v1/explain/envoy": true,
	"/v1/acquire": true, "/v1/release": true, "/v1/extend": true, "/v1/auth": true, "/v1/overrides": true,
}

// spanMethod is a request's method as its span's name has it: the
// method, or "HTTP" for one that is not HTTP's (as OpenTelemetry's
// conventions name them), since any client can send any token.
func spanMethod(m string) string {
	switch m {
	case http.MethodGet, http.MethodHead, http.MethodPost, http.MethodPut, http.MethodPatch,
		http.MethodDelete, http.MethodConnect, http.MethodOptions, http.MethodTrace:
		return m
	}
	return "HTTP"
}

func httpStatus(code int) string {
	b := []byte{byte('0' + code/100%10), byte('0' + code/10%10), byte('0' + code%10)}
	return string(b)
}

// statusWriter remembers the status that a handler answered.
type statusWriter struct {
	http.ResponseWriter
	status int
	wrote  bool
}

func (w *statusWriter) WriteHeader(code int) {
	if !w.wrote {
		w.status, w.wrote = code, true
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusWriter) Write(b []byte) (int, error) {
	w.wrote = true
	return w.ResponseWriter.Write(b)
}

// Unwrap lets http.ResponseController reach the connection's writer.
func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// GRPC returns the server option that traces gRPC calls with tp, as HTTP
// does requests: Envoy's ShouldRateLimit in a server span under the
// caller's (Envoy's tracing sends traceparent in the call's metadata),
// with the domain (its descriptors are floodgate.group's requests).
// Health checks are not traced.
func GRPC(tp trace.TracerProvider) grpc.ServerOption {
	return grpc.ChainUnaryInterceptor(unary(tp.Tracer(TracerName)))
}

// unary is GRPC's interceptor.
func unary(tracer trace.Tracer) grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		if strings.HasPrefix(info.FullMethod, "/grpc.health.") {
			return handler(ctx, req)
		}
		md, _ := metadata.FromIncomingContext(ctx)
		ctx = propagator.Extract(ctx, mdCarrier(md))
		name := strings.TrimPrefix(info.FullMethod, "/")
		ctx, span := tracer.Start(ctx, name, trace.WithSpanKind(trace.SpanKindServer))
		defer span.End()
		resp, err := handler(ctx, req)
		if span.IsRecording() {
			service, method, _ := strings.Cut(name, "/")
			code := status.Code(err)
			span.SetAttributes(
				attribute.String("rpc.system", "grpc"),
				attribute.String("rpc.service", service),
				attribute.String("rpc.method", method),
				attribute.Int("rpc.grpc.status_code", int(code)),
			)
			if r, ok := req.(interface {
				GetDomain() string
			}); ok {
				span.SetAttributes(attribute.String("floodgate.envoy.domain", r.GetDomain()))
			}
			if err != nil {
				span.SetStatus(codes.Error, err.Error())
				span.SetAttributes(attribute.String("error.type", code.String()))
			}
		}
		return resp, err
	}
}

// mdCarrier reads a call's metadata for the propagator.
type mdCarrier metadata.MD

func (c mdCarrier) Get(key string) string {
	if v := metadata.MD(c).Get(key); len(v) > 0 {
		return v[0]
	}
	return ""
}

func (c mdCarrier) Set(key, value string) { metadata.MD(c).Set(key, value) }

func (c mdCarrier) Keys() []string {
	keys := make([]string, 0, len(c))
	for k := range c {
		keys = append(keys, k)
	}
	return keys
}
