package httpapi_test

import (
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	rls "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/floodgate/floodgate"
	"github.com/floodgate/floodgate/internal/server/config"
	"github.com/floodgate/floodgate/internal/server/envoy"
	"github.com/floodgate/floodgate/internal/server/httpapi"
	"github.com/floodgate/floodgate/internal/server/service"
	"google.golang.org/protobuf/encoding/protojson"
)

// envoyOn is the Envoy service of cfg, with opts (nil: the defaults),
// over a memory store of its own, its failures logged nowhere.
func envoyOn(t testing.TB, cfg *config.Config, opts *envoy.Options) *envoy.Service {
	t.Helper()
	st := floodgate.NewMemoryStore(&floodgate.MemoryOptions{SweepInterval: -1})
	t.Cleanup(func() { st.Close() })
	svc, err := envoy.New(st, cfg, &service.Options{Logger: slog.New(slog.DiscardHandler)}, opts)
	if err != nil {
		t.Fatal(err)
	}
	return svc
}

// webEnvoy is the Envoy service of a "web" domain that allows each ip 1
// request an hour, on envoyOn.
func webEnvoy(t *testing.T) *envoy.Service {
	t.Helper()
	cfg, err := config.Parse("web.yaml", []byte("domain: web\ndescriptors:\n  - key: ip\n    rate_limit: {unit: hour, requests_per_unit: 1}\n"))
	if err != nil {
		t.Fatal(err)
	}
	return envoyOn(t, cfg, nil)
}

// TestEnvoyJSON is envoyproxy/ratelimit's POST /json: the same request
// and answer as over gRPC, in protobuf's JSON mapping.
func TestEnvoyJSON(t *testing.T) {
	svc := webEnvoy(t)
	h := httpapi.Handler(svc.Rules(), &httpapi.Options{Logger: slog.New(slog.DiscardHandler), Envoy: svc.JSONHandler(slog.New(slog.DiscardHandler))})
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

// fuzzDomain uses every part of envoyproxy/ratelimit's format that
// changes how a request is decided, and floodgate's algorithms.
const fuzzDomain = `domain: web
descriptors:
  - key: ip
    rate_limit: {unit: second, requests_per_unit: 3}
  - key: path
    value: /api/*
    share_threshold: true
    rate_limit: {unit: minute, requests_per_unit: 5}
  - key: user
    descriptors:
      - key: plan
        value: free
        rate_limit: {unit: hour, requests_per_unit: 2, name: free, replaces: [{name: any}]}
      - key: plan
        rate_limit: {unit: hour, requests_per_unit: 9, name: any}
  - key: open
    rate_limit: {unlimited: true}
  - key: blocked
    rate_limit: {unit: second, requests_per_unit: 0}
  - key: shadow
    shadow_mode: true
    rate_limit: {unit: second, requests_per_unit: 1}
  - key: bucket
    rate_limit: {unit: second, requests_per_unit: 10, algorithm: token-bucket, burst: 30}
  - key: log
    rate_limit: {unit: minute, unit_multiplier: 10, requests_per_unit: 4, algorithm: sliding-log}
`

// FuzzEnvoyJSON sends POST /json any body, and well-formed requests of
// any descriptors, costs and limit overrides: the answer is 200 or 429
// with a RateLimitResponse, or 400 with a problem, never a failure or a
// panic, with or without the atomic option.
//
//	go test -run - -fuzz FuzzEnvoyJSON ./internal/server/httpapi
func FuzzEnvoyJSON(f *testing.F) {
	f.Add(`{"domain":"web","descriptors":[{"entries":[{"key":"ip","value":"a"}]}]}`, "", "", "", uint32(0), uint32(0), 0, false)
	f.Add("", "path", "/api/x", "ip", uint32(1), uint32(7), 2, true)
	f.Add("", "user", "u", "plan", uint32(0), uint32(4294967295), 5, false)
	f.Add("", "bucket", "b", "", uint32(4294967295), uint32(1), 3, true)
	f.Add("", "log", "", "blocked", uint32(2), uint32(0), 0, false)
	f.Add(`{"domain":"web","hitsAddend":18446744073709551615,"descriptors":[{"entries":[{"key":"open","value":"x"}],"limit":{"requestsPerUnit":1,"unit":"YEAR"}}]}`, "", "", "", uint32(0), uint32(0), 0, false)
	cfg, err := config.Parse("web.yaml", []byte(fuzzDomain))
	if err != nil {
		f.Fatal(err)
	}
	var handlers [2]http.Handler
	for i, atomic := range []bool{false, true} {
		svc := envoyOn(f, cfg, &envoy.Options{StopIncrementWhenOverLimit: atomic})
		handlers[i] = httpapi.Handler(svc.Rules(), &httpapi.Options{Logger: slog.New(slog.DiscardHandler), Envoy: svc.JSONHandler(slog.New(slog.DiscardHandler))})
	}
	f.Fuzz(func(t *testing.T, body, k1, v1, k2 string, hits, perUnit uint32, unit int, atomic bool) {
		if body == "" {
			limit := ""
			if unit > 0 {
				limit = fmt.Sprintf(`,"limit":{"requestsPerUnit":%d,"unit":%d}`, perUnit, unit%8)
			}
			b, _ := json.Marshal(map[string]any{"k1": k1, "v1": v1, "k2": k2})
			var s map[string]string
			json.Unmarshal(b, &s) // the strings as valid UTF-8, which protojson requires
			esc := func(v string) string { q, _ := json.Marshal(v); return string(q) }
			body = fmt.Sprintf(`{"domain":"web","hitsAddend":%d,"descriptors":[{"entries":[{"key":%s,"value":%s}]%s},{"entries":[{"key":%s,"value":%s},{"key":%s,"value":"free"}],"hitsAddend":%d}]}`,
				hits, esc(s["k1"]), esc(s["v1"]), limit, esc(s["k1"]), esc(s["v1"]), esc(s["k2"]), perUnit)
		}
		h := handlers[0]
		if atomic {
			h = handlers[1]
		}
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest("POST", "/json", strings.NewReader(body)))
		switch rec.Code {
		case 200, 429:
			var resp rls.RateLimitResponse
			if err := protojson.Unmarshal(rec.Body.Bytes(), &resp); err != nil {
				t.Fatalf("%s: %d %s: %v", body, rec.Code, rec.Body, err)
			}
			if over := resp.OverallCode == rls.RateLimitResponse_OVER_LIMIT; over != (rec.Code == 429) {
				t.Fatalf("%s: %d with %v", body, rec.Code, resp.OverallCode)
			}
		case 400:
			if !json.Valid(rec.Body.Bytes()) {
				t.Fatalf("%s: 400 %q is not JSON", body, rec.Body)
			}
		default:
			t.Fatalf("%s: %d %s", body, rec.Code, rec.Body)
		}
	})
}
