package httpapi_test

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/floodgate/floodgate"
	"github.com/floodgate/floodgate/core"
	"github.com/floodgate/floodgate/internal/lib/logctx"
	"github.com/floodgate/floodgate/internal/server/config"
	"github.com/floodgate/floodgate/internal/server/httpapi"
	"github.com/floodgate/floodgate/internal/testkit/syncbuf"
)

// failStore is a store whose every decision fails, as Redis down without
// a fallback.
type failStore struct{ floodgate.Store }

func (s failStore) Prepare(l []core.Spec) (core.Policy, error) {
	p, err := s.Store.Prepare(l)
	return failPolicy{p}, err
}

type failPolicy struct{ core.Policy }

func (failPolicy) Take(context.Context, string, int64) (core.Decision, error) {
	return core.Decision{}, fmt.Errorf("%w: connection refused", floodgate.ErrStore)
}

// TestStoreFailureLogBounded: a store failing every check logs a line a
// second, not one a request, with the trace id of a traceparent header.
func TestStoreFailureLogBounded(t *testing.T) {
	mem := floodgate.NewMemoryStore(&floodgate.MemoryOptions{SweepInterval: -1})
	t.Cleanup(func() { mem.Close() })
	var buf syncbuf.Buffer
	h := handlerOn(t, failStore{mem}, config.Example(), &httpapi.Options{Logger: slog.New(logctx.NewHandler(slog.NewTextHandler(&buf, nil)))})
	const requests = 200
	start := time.Now()
	for i := range requests {
		rec := httptest.NewRecorder()
		req := httptest.NewRequest(http.MethodPost, "/v1/check", strings.NewReader(`{"rule":"example","key":"k"}`))
		req.Header.Set("Content-Type", "application/json")
		if i == 0 { // the line logged: with the trace id of its request
			req.Header.Set("Traceparent", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")
		}
		h.ServeHTTP(rec, req)
		if rec.Code < 500 {
			t.Fatalf("status %d, want a 5xx: %s", rec.Code, rec.Body)
		}
	}
	secs := time.Since(start).Seconds()
	out := buf.String()
	lines := strings.Count(out, "\n")
	if lines < 1 || float64(lines) > 1+secs {
		t.Errorf("%d requests in %.2fs logged %d lines, want 1 and at most one a second more:\n%s", requests, secs, lines, out)
	}
	if !strings.Contains(out, `msg="floodgate: check failed" rule=example`) || !strings.Contains(out, "trace_id=4bf92f3577b34da6a3ce929d0e0e4736") {
		t.Errorf("no line for the failed check:\n%s", out)
	}
}
