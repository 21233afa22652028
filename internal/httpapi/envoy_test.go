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

// TestSettle is POST /v1/settle: a check charged an estimate, the real
// cost is settled afterwards.
func TestSettle(t *testing.T) {
	h := newHandler(t, &httpapi.Options{Token: "s3cret"})
	post := func(path, body string) (int, string) {
		req := httptest.NewRequest("POST", path, strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Authorization", "Bearer s3cret")
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		return rec.Code, rec.Body.String()
	}
	if code, body := post("/v1/check", `{"rule":"example","key":"llm","cost":15}`); code != 200 || !strings.Contains(body, `"remaining":5`) {
		t.Fatalf("check: %d %s", code, body)
	}
	for _, tc := range []struct {
		body   string
		status int
		want   string
	}{
		{`{"rule":"example","key":"llm","charged":15,"cost":5}`, 200, `"remaining":15`},
		{`{"rule":"example","key":"llm","charged":5,"cost":30}`, 200, `"remaining":0`},
		{`{"rule":"example","key":"llm","charged":1,"cost":-1}`, 400, "must not be negative"},
		{`{"rule":"nope","key":"llm","charged":1,"cost":2}`, 404, "unknown rule"},
		{`{"rule":"example","key":"","charged":1,"cost":2}`, 400, "empty key"},
	} {
		if code, body := post("/v1/settle", tc.body); code != tc.status || !strings.Contains(body, tc.want) {
			t.Errorf("%s: %d %s, want %d with %s", tc.body, code, body, tc.status, tc.want)
		}
	}
	// In debt now: the next check is denied.
	if code, body := post("/v1/check", `{"rule":"example","key":"llm"}`); code != 200 || !strings.Contains(body, `"allowed":false`) {
		t.Errorf("check after the debt: %d %s", code, body)
	}
}
