package httplimit_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"testing"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/floodgate/floodgate"
	"github.com/floodgate/floodgate/httplimit"
)

// TestTraced: with a traced Limiter, the middleware's check is a span
// under the request's own (the one an application's HTTP instrumentation
// puts in its context, from the caller's traceparent): the middleware
// needs no option of its own.
func TestTraced(t *testing.T) {
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	defer tp.Shutdown(context.Background())
	st := floodgate.NewMemoryStore(nil)
	defer st.Close()
	lim, err := floodgate.NewLimiter(st, []floodgate.Limit{floodgate.PerSecond(10)}, &floodgate.Options{TracerProvider: tp})
	if err != nil {
		t.Fatal(err)
	}
	h := httplimit.New(lim, nil).Handler(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	ctx, span := tp.Tracer("app").Start(context.Background(), "GET /")
	req := httptest.NewRequest("GET", "/", nil).WithContext(ctx)
	w := httptest.NewRecorder()
	h.ServeHTTP(w, req)
	span.End()
	spans := rec.Ended()
	if w.Code != 200 || len(spans) != 2 || spans[0].Name() != floodgate.SpanCheck || spans[0].Parent().SpanID() != span.SpanContext().SpanID() {
		t.Fatalf("status %d, spans %d; want the check's span under the request's", w.Code, len(spans))
	}
}
