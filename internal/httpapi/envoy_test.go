package httpapi_test

import (
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/floodgate/floodgate"
	"github.com/floodgate/floodgate/internal/config"
	"github.com/floodgate/floodgate/internal/httpapi"
	"github.com/floodgate/floodgate/internal/service"
)

// TestEnvoyJSON is envoyproxy/ratelimit's POST /json: the same request
// and answer as over gRPC, in protobuf's JSON mapping.
func TestEnvoyJSON(t *testing.T) {
	st := floodgate.NewMemoryStore(&floodgate.MemoryOptions{SweepInterval: -1})
	t.Cleanup(func() { st.Close() })
	cfg, err := config.Parse("web.yaml", []byte("domain: web\ndescriptors:\n  - key: ip\n    rate_limit: {unit: hour, requests_per_unit: 1}\n"))
	if err != nil {
		t.Fatal(err)
	}
	svc, err := service.New(st, cfg, &service.Options{Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	h := httpapi.Handler(svc, &httpapi.Options{Logger: slog.New(slog.DiscardHandler)})
	const req = `{"domain":"web","descriptors":[{"entries":[{"key":"ip","value":"a"}]}]}`
	for _, tc := range []struct {
		name, body string
		status     int
		want       string
	}{
		{"within", req, 200, `"overallCode":"OK"`},
		{"over", req, 429, `"overallCode":"OVER_LIMIT"`},
		{"no rule", `{"domain":"web","descriptors":[{"entries":[{"key":"other"}]}]}`, 200, `"statuses":[{"code":"OK"}]`},
		{"empty domain", `{"descriptors":[{"entries":[{"key":"ip"}]}]}`, 400, "rate limit domain must not be empty"},
		{"no descriptors", `{"domain":"web"}`, 400, "rate limit descriptor list must not be empty"},
		{"malformed", `{"domain":`, 400, "not a RateLimitRequest"},
		{"unknown field", `{"domain":"web","nope":1}`, 400, "not a RateLimitRequest"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, httptest.NewRequest("POST", "/json", strings.NewReader(tc.body)))
			body := strings.ReplaceAll(rec.Body.String(), " ", "")
			if rec.Code != tc.status || !strings.Contains(body, strings.ReplaceAll(tc.want, " ", "")) {
				t.Errorf("%d %s, want %d with %s", rec.Code, rec.Body, tc.status, tc.want)
			}
		})
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest("GET", "/json", nil))
	if rec.Code != http.StatusMethodNotAllowed {
		t.Errorf("GET /json: %d, want 405", rec.Code)
	}
}
