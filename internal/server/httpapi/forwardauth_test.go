package httpapi_test

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"testing"

	"github.com/floodgate/floodgate"
	"github.com/floodgate/floodgate/internal/server/config"
	"github.com/floodgate/floodgate/internal/server/httpapi"
	"github.com/floodgate/floodgate/internal/server/service"
	"github.com/floodgate/floodgate/storetest"
)

// authHandler is the API on the example rule (burst 20, 10/s) on a clock
// that stands still, behind the proxy 10.0.0.1.
func authHandler(t *testing.T, o httpapi.Options) http.Handler {
	t.Helper()
	st := floodgate.NewMemoryStore(&floodgate.MemoryOptions{Clock: storetest.NewClock(storetest.Base), SweepInterval: -1})
	t.Cleanup(func() { st.Close() })
	return handlerOn(t, st, config.Example(), &o)
}

var proxy = []netip.Prefix{netip.MustParsePrefix("10.0.0.1/32")}

// authReq is a request from the proxy 10.0.0.1 with headers as
// name, value pairs.
func authReq(target string, hdr ...string) *http.Request {
	path, query, _ := strings.Cut(target, "?")
	req := httptest.NewRequest("GET", path, nil)
	req.URL.RawQuery = strings.ReplaceAll(query, " ", "%20")
	req.RemoteAddr = "10.0.0.1:4000"
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Add(hdr[i], hdr[i+1])
	}
	return req
}

func TestForwardAuthInput(t *testing.T) {
	long := strings.Repeat("k", service.MaxKeyLen)
	tests := []struct {
		name   string
		opts   httpapi.Options
		req    *http.Request
		status int
		key    string // the key charged, when the check was made
		detail string // in the problem's detail
	}{
		{"rule in the path", httpapi.Options{}, authReq("/v1/auth/example?key=k"), 200, "k", ""},
		{"rule in the header", httpapi.Options{}, authReq("/v1/auth?key=k", "X-Floodgate-Rule", "example"), 200, "k", ""},
		{"the path wins over a forged rule header", httpapi.Options{}, authReq("/v1/auth/example?key=k", "X-Floodgate-Rule", "other"), 200, "k", ""},
		{"no rule", httpapi.Options{}, authReq("/v1/auth?key=k"), 400, "", "no rule"},
		{"two rule headers", httpapi.Options{}, authReq("/v1/auth?key=k", "X-Floodgate-Rule", "example", "X-Floodgate-Rule", "x"), 400, "", "2 X-Floodgate-Rule"},
		{"unknown rule", httpapi.Options{}, authReq("/v1/auth/nope?key=k"), 404, "", "unknown rule"},
		{"unknown parameter", httpapi.Options{}, authReq("/v1/auth/example?keys=k"), 400, "", "unknown parameter"},
		{"parameter twice", httpapi.Options{}, authReq("/v1/auth/example?key=a&key=b"), 400, "", "2 times"},
		{"bad deny", httpapi.Options{}, authReq("/v1/auth/example?key=k&deny=500"), 400, "", "deny must be"},
		{"deny 401", httpapi.Options{}, authReq("/v1/auth/example?key=k&deny=401"), 400, "", "deny must be 403 or 429"},

		{"ip from X-Forwarded-For", httpapi.Options{TrustedProxies: proxy}, authReq("/v1/auth/example", "X-Forwarded-For", "203.0.113.7"), 200, "203.0.113.7", ""},
		{"a client's forged hop is behind the proxy's", httpapi.Options{TrustedProxies: proxy}, authReq("/v1/auth/example", "X-Forwarded-For", "6.6.6.6, 203.0.113.7"), 200, "203.0.113.7", ""},
		{"IPv6 by /64", httpapi.Options{TrustedProxies: proxy}, authReq("/v1/auth/example", "X-Forwarded-For", "2001:db8:1:2::7"), 200, "2001:db8:1:2::/64", ""},
		{"ip from X-Real-IP", httpapi.Options{TrustedProxies: proxy, ClientIPHeader: "X-Real-IP"}, authReq("/v1/auth/example", "X-Real-IP", "203.0.113.8", "X-Forwarded-For", "6.6.6.6"), 200, "203.0.113.8", ""},
		{"ip without trusted proxies", httpapi.Options{}, authReq("/v1/auth/example", "X-Forwarded-For", "203.0.113.7"), 400, "", "--trusted-proxies"},
		{"ip from a caller that is not trusted", httpapi.Options{TrustedProxies: []netip.Prefix{netip.MustParsePrefix("10.9.0.0/16")}}, authReq("/v1/auth/example", "X-Forwarded-For", "203.0.113.7"), 400, "", "not one of --trusted-proxies"},
		{"ip missing", httpapi.Options{TrustedProxies: proxy}, authReq("/v1/auth/example"), 400, "", "no key source"},
		{"bad client IP header", httpapi.Options{TrustedProxies: proxy, ClientIPHeader: "X-Client"}, authReq("/v1/auth/example", "X-Client", "1.2.3.4"), 400, "", "X-Client"},

		{"api key", httpapi.Options{}, authReq("/v1/auth/example?key={header:x-api-key}", "X-Api-Key", "abc"), 200, "abc", ""},
		{"api key missing", httpapi.Options{}, authReq("/v1/auth/example?key={header:X-Api-Key}"), 400, "", "none of X-Api-Key"},
		{"api key twice", httpapi.Options{}, authReq("/v1/auth/example?key={header:X-Api-Key}", "X-Api-Key", "a", "X-Api-Key", "b"), 400, "", "2 X-Api-Key"},
		{"api key, else ip", httpapi.Options{TrustedProxies: proxy}, authReq("/v1/auth/example?key={header:X-Api-Key|ip}", "X-Forwarded-For", "203.0.113.7"), 200, "203.0.113.7", ""},
		{"template", httpapi.Options{TrustedProxies: proxy}, authReq("/v1/auth/example?key=u:{ip}:{header:X-Api-Key}", "X-Forwarded-For", "203.0.113.7", "X-Api-Key", "abc"), 200, "u:203.0.113.7:abc", ""},
		{"Caddy's and Traefik's method and URI", httpapi.Options{}, authReq("/v1/auth/example?key={method}+{uri}", "X-Forwarded-Method", "POST", "X-Forwarded-Uri", "/a?b=1"), 200, "POST /a?b=1", ""},
		{"nginx's method and URI", httpapi.Options{}, authReq("/v1/auth/example?key={method}+{uri}", "X-Original-Method", "PUT", "X-Original-URI", "/c"), 200, "PUT /c", ""},
		{"both URIs, the same", httpapi.Options{}, authReq("/v1/auth/example?key={uri}", "X-Original-URI", "/c", "X-Forwarded-Uri", "/c"), 200, "/c", ""},
		{"both URIs, one forged", httpapi.Options{}, authReq("/v1/auth/example?key={uri}", "X-Original-URI", "/c", "X-Forwarded-Uri", "/d"), 400, "", "which differ"},
		{"path cleaned", httpapi.Options{}, authReq("/v1/auth/example?key={path}", "X-Forwarded-Uri", "/a//b/../%6Cogin/?x=1"), 200, "/a/login", ""},
		{"path of an absolute URI", httpapi.Options{}, authReq("/v1/auth/example?key={path}", "X-Forwarded-Uri", "http://h/x"), 200, "/x", ""},
		{"path with a bad escape", httpapi.Options{}, authReq("/v1/auth/example?key={path}", "X-Forwarded-Uri", "/%zz"), 400, "", "not a request URI"},
		{"no method", httpapi.Options{}, authReq("/v1/auth/example?key={method}"), 400, "", "X-Forwarded-Method or X-Original-Method"},
		{"unknown placeholder", httpapi.Options{}, authReq("/v1/auth/example?key={host}"), 400, "", "unknown placeholder {host}"},
		{"unclosed brace", httpapi.Options{}, authReq("/v1/auth/example?key={ip"), 400, "", "no } closes"},
		{"stray brace", httpapi.Options{}, authReq("/v1/auth/example?key=a}"), 400, "", "closes no {"},
		{"bad header name", httpapi.Options{}, authReq("/v1/auth/example?key={header:a b}"), 400, "", "unknown placeholder"},
		{"empty template", httpapi.Options{}, authReq("/v1/auth/example?key="), 400, "", "empty"},
		{"long template", httpapi.Options{}, authReq("/v1/auth/example?key=" + strings.Repeat("a", httpapi.MaxKeyTemplate+1)), 400, "", "key template is"},
		{"oversize key", httpapi.Options{}, authReq("/v1/auth/example?key=x{header:X-Api-Key}", "X-Api-Key", long), 431, "", "more than 512 bytes"},
		{"oversize key, many placeholders", httpapi.Options{}, authReq("/v1/auth/example?key="+strings.Repeat("{header:A}", 25), "A", strings.Repeat("k", 30)), 431, "", "more than 512 bytes"},
		{"key of the maximum length", httpapi.Options{}, authReq("/v1/auth/example?key={header:X-Api-Key}", "X-Api-Key", long), 200, long, ""},

		{"cost", httpapi.Options{}, authReq("/v1/auth/example?key=k", "X-Floodgate-Cost", "5"), 200, "k", ""},
		{"cost 0 peeks", httpapi.Options{}, authReq("/v1/auth/example?key=k", "X-Floodgate-Cost", "0"), 200, "k", ""},
		{"negative cost", httpapi.Options{}, authReq("/v1/auth/example?key=k", "X-Floodgate-Cost", "-1"), 400, "", "whole number"},
		{"cost not a number", httpapi.Options{}, authReq("/v1/auth/example?key=k", "X-Floodgate-Cost", "1.5"), 400, "", "whole number"},
		{"empty cost", httpapi.Options{}, authReq("/v1/auth/example?key=k", "X-Floodgate-Cost", ""), 400, "", "whole number"},
		{"huge cost", httpapi.Options{}, authReq("/v1/auth/example?key=k", "X-Floodgate-Cost", "99999999999999999999"), 400, "", "whole number"},
		{"two costs", httpapi.Options{}, authReq("/v1/auth/example?key=k", "X-Floodgate-Cost", "1", "X-Floodgate-Cost", "0"), 400, "", "2 X-Floodgate-Cost"},

		{"token required", httpapi.Options{Token: "s"}, authReq("/v1/auth/example?key=k"), 401, "", "bearer"},
		{"token given", httpapi.Options{Token: "s"}, authReq("/v1/auth/example?key=k", "Authorization", "Bearer s"), 200, "k", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := authHandler(t, tt.opts)
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, tt.req)
			if rec.Code != tt.status {
				t.Fatalf("status %d, want %d: %s", rec.Code, tt.status, rec.Body)
			}
			var body map[string]any
			if err := json.Unmarshal(rec.Body.Bytes(), &body); err != nil {
				t.Fatalf("body is not JSON: %q", rec.Body)
			}
			if tt.status != 200 {
				if d, _ := body["detail"].(string); !strings.Contains(d, tt.detail) {
					t.Errorf("detail %q does not say %q", d, tt.detail)
				}
				if rec.Header().Get("RateLimit") != "" {
					t.Errorf("an error answer has RateLimit %q", rec.Header().Get("RateLimit"))
				}
				return
			}
			if got := rec.Header().Get("RateLimit-Policy"); got != `"example";q=20;w=2` {
				t.Errorf("RateLimit-Policy %q", got)
			}
			// The key charged is the one the next check on it sees used.
			insp := httptest.NewRecorder()
			h.ServeHTTP(insp, authReqTok(tt.opts.Token, "/v1/inspect?rule=example&key="+urlQuery(tt.key)))
			var st map[string]any
			json.Unmarshal(insp.Body.Bytes(), &st)
			want := float64(19)
			if c := tt.req.Header.Get("X-Floodgate-Cost"); c != "" {
				want = float64(20 - map[string]int{"5": 5, "0": 0}[c])
			}
			if st["remaining"] != want {
				t.Errorf("key %q has %v remaining after the check, want %v (%s)", tt.key, st["remaining"], want, insp.Body)
			}
		})
	}
}

func authReqTok(token, target string) *http.Request {
	if token == "" {
		return authReq(target)
	}
	return authReq(target, "Authorization", "Bearer "+token)
}

func urlQuery(s string) string {
	r := strings.NewReplacer("%", "%25", "+", "%2B", " ", "%20", "?", "%3F", "&", "%26", "/", "%2F", ":", "%3A")
	return r.Replace(s)
}

// TestForwardAuthDenial: a burst passes with its RateLimit headers, the
// next request is denied with the status asked for and Retry-After.
func TestForwardAuthDenial(t *testing.T) {
	tests := []struct {
		name   string
		query  string
		status int
	}{
		{"nginx's default", "", 403},
		{"Caddy, Traefik", "&deny=429", 429},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := authHandler(t, httpapi.Options{TrustedProxies: proxy})
			for i := range 20 {
				rec := httptest.NewRecorder()
				h.ServeHTTP(rec, authReq("/v1/auth/example?key={ip}"+tt.query, "X-Forwarded-For", "203.0.113.7"))
				if rec.Code != 200 {
					t.Fatalf("request %d of the burst: %d %s", i, rec.Code, rec.Body)
				}
				if got, want := rec.Header().Get("RateLimit"), `"example";r=`; !strings.HasPrefix(got, want) {
					t.Errorf("RateLimit %q", got)
				}
				if rec.Header().Get("Retry-After") != "" {
					t.Errorf("an allowed request has Retry-After")
				}
			}
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, authReq("/v1/auth/example?key={ip}"+tt.query, "X-Forwarded-For", "203.0.113.7"))
			want := map[string]string{
				"Retry-After":      "1",
				"RateLimit":        `"example";r=0;t=1`,
				"RateLimit-Policy": `"example";q=20;w=2`,
				"Content-Type":     "application/problem+json",
			}
			if rec.Code != tt.status {
				t.Errorf("status %d, want %d", rec.Code, tt.status)
			}
			for k, v := range want {
				if got := rec.Header().Get(k); got != v {
					t.Errorf("%s: %q, want %q", k, got, v)
				}
			}
			// Another client is not limited.
			rec = httptest.NewRecorder()
			h.ServeHTTP(rec, authReq("/v1/auth/example?key={ip}"+tt.query, "X-Forwarded-For", "203.0.113.8"))
			if rec.Code != 200 {
				t.Errorf("another client: %d", rec.Code)
			}
		})
	}
}

// TestForwardAuthNever: a cost that can never pass is denied without a
// Retry-After, which would promise it could.
func TestForwardAuthNever(t *testing.T) {
	h := authHandler(t, httpapi.Options{})
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, authReq("/v1/auth/example?key=k&deny=429", "X-Floodgate-Cost", "21"))
	if rec.Code != 429 || rec.Header().Get("Retry-After") != "" || !strings.Contains(rec.Body.String(), "never") {
		t.Errorf("%d Retry-After %q %s", rec.Code, rec.Header().Get("Retry-After"), rec.Body)
	}
}
