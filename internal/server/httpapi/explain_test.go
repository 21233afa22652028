package httpapi_test

import (
	"encoding/json"
	"log/slog"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"

	"github.com/floodgate/floodgate/internal/server/httpapi"
	"github.com/floodgate/floodgate/internal/server/service"
)

// GET /v1/explain: the explanation, behind the token, charging nothing;
// and a clear 4xx for what is wrong with the request.
func TestExplainEndpoint(t *testing.T) {
	h := newHandler(t, &httpapi.Options{Token: "s3cret"})
	get := func(query, auth string) (int, string) {
		req := httptest.NewRequest("GET", "/v1/explain?"+query, nil)
		if auth != "" {
			req.Header.Set("Authorization", "Bearer "+auth)
		}
		w := httptest.NewRecorder()
		h.ServeHTTP(w, req)
		return w.Code, w.Body.String()
	}
	long := strings.Repeat("k", service.MaxKeyLen+1)
	tests := []struct {
		name   string
		query  string
		auth   string
		status int
		want   string
	}{
		{"no token", "rule=example&key=k", "", 401, "bearer token"},
		{"wrong token", "rule=example&key=k", "nope", 401, "bearer token"},
		{"missing rule", "key=k", "s3cret", 400, "rule is required"},
		{"unknown rule", "rule=nope&key=k", "s3cret", 404, `unknown rule \"nope\"`},
		{"missing key", "rule=example", "s3cret", 400, "empty key"},
		{"oversize key", "rule=example&key=" + long, "s3cret", 400, "more than the maximum 512"},
		{"explained", "rule=example&key=" + url.QueryEscape("user:42"), "s3cret", 200, `"remaining":20`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			status, body := get(tt.query, tt.auth)
			if status != tt.status || !strings.Contains(body, tt.want) {
				t.Errorf("GET /v1/explain?%.40s = %d %s; want %d with %s", tt.query, status, body, tt.status, tt.want)
			}
		})
	}
	// Twice, and a check after: nothing was charged.
	for range 2 {
		status, body := get("rule=example&key=k", "s3cret")
		var e service.Explanation
		if err := json.Unmarshal([]byte(body), &e); err != nil || status != 200 {
			t.Fatalf("%d %s: %v", status, body, err)
		}
		if e.Rule != "example" || e.Key != "k" || !e.Allowed || len(e.Limits) != 1 || e.Limits[0].Remaining != 20 || e.Store.Name != "memory" || len(e.Why) == 0 {
			t.Fatalf("explanation: %+v", e)
		}
	}
	req := httptest.NewRequest("POST", "/v1/check", strings.NewReader(`{"rule":"example","key":"k"}`))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer s3cret")
	w := httptest.NewRecorder()
	h.ServeHTTP(w, req)
	if !strings.Contains(w.Body.String(), `"remaining":19`) {
		t.Errorf("the check after explaining: %s; want 19 left of 20", w.Body.String())
	}
}

// POST /v1/explain/envoy: mounted from Options.EnvoyExplain, behind the
// token, JSON only; the explanation says the same as ShouldRateLimit.
func TestExplainEnvoyEndpoint(t *testing.T) {
	svc := webEnvoy(t)
	log := slog.New(slog.DiscardHandler)
	h := httpapi.Handler(svc.Rules(), &httpapi.Options{Token: "s3cret", Logger: log, Envoy: svc.JSONHandler(log), EnvoyExplain: svc.ExplainHandler(log)})
	const req = `{"domain":"web","descriptors":[{"entries":[{"key":"ip","value":"a"}]}]}`
	do := func(method, path, ctype, auth, body string) (int, string) {
		r := httptest.NewRequest(method, path, strings.NewReader(body))
		if ctype != "" {
			r.Header.Set("Content-Type", ctype)
		}
		if auth != "" {
			r.Header.Set("Authorization", "Bearer "+auth)
		}
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		return w.Code, w.Body.String()
	}
	tests := []struct {
		name, method, ctype, auth, body string
		status                          int
		want                            string
	}{
		{"no token", "POST", "application/json", "", req, 401, "bearer token"},
		{"a form", "POST", "application/x-www-form-urlencoded", "s3cret", req, 415, "Content-Type: application/json"},
		{"GET", "GET", "", "s3cret", "", 405, "use POST"},
		{"malformed", "POST", "application/json", "s3cret", `{"domain":`, 400, "not a RateLimitRequest"},
		{"within", "POST", "application/json", "s3cret", req, 200, `"overall_code":"OK"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if status, body := do(tt.method, "/v1/explain/envoy", tt.ctype, tt.auth, tt.body); status != tt.status || !strings.Contains(body, tt.want) {
				t.Errorf("%d %s; want %d with %s", status, body, tt.status, tt.want)
			}
		})
	}
	// One hit through /json uses the limit up: the explanation says the
	// next is over it, and /json agrees.
	if status, _ := do("POST", "/json", "", "s3cret", req); status != 200 {
		t.Fatalf("/json: %d", status)
	}
	if status, body := do("POST", "/v1/explain/envoy", "application/json", "s3cret", req); status != 200 || !strings.Contains(body, `"overall_code":"OVER_LIMIT"`) || !strings.Contains(body, `"remaining":0`) {
		t.Errorf("after one hit: %d %s", status, body)
	}
	if status, _ := do("POST", "/json", "", "s3cret", req); status != 429 {
		t.Errorf("/json after the explanation: %d; want 429", status)
	}
}
