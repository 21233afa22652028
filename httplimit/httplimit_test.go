package httplimit_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/floodgate/floodgate"
	"github.com/floodgate/floodgate/core"
	"github.com/floodgate/floodgate/httplimit"
	"github.com/floodgate/floodgate/internal/lib/storekit"
	"github.com/floodgate/floodgate/storetest"
	"go.uber.org/goleak"
)

// stubStore returns fixed results or errors: the stand-in for a store in
// tests of header formatting and failure handling.
type stubStore struct {
	core.Store  // nil: the tests call only the methods below
	core.Policy // nil: the tests call only the methods below
	res         core.Decision
	err         error
}

func (s *stubStore) Prepare([]core.Spec) (core.Policy, error) { return s, nil }
func (s *stubStore) Close() error                             { return nil }
func (s *stubStore) Take(ctx context.Context, key string, n int64) (core.Decision, error) {
	if err := storekit.CheckRequest(key, n); err != nil {
		return core.Decision{}, err
	}
	return s.res, s.err
}
func (s *stubStore) Reset(context.Context, string) error { return s.err }

var ok = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.Write([]byte("ok")) })

func do(h http.Handler, remote string, hdr ...string) *httptest.ResponseRecorder {
	req := httptest.NewRequest("GET", "/x", nil)
	req.RemoteAddr = remote
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Add(hdr[i], hdr[i+1])
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	return rec
}

func TestHeaders(t *testing.T) {
	lim, clock := storetest.NewLimiter(t, floodgate.TokenBucket(1, time.Second, 3).Named("burst"), floodgate.FixedWindow(100, time.Hour).Named("hourly"))
	h := httplimit.New(lim, &httplimit.Options{LegacyHeaders: true}).Handler(ok)
	type want struct {
		status                       int
		rateLimit, retryAfter, reset string
	}
	steps := []struct {
		advance time.Duration
		want    want
	}{
		{0, want{200, `"burst";r=2;t=1`, "", "1"}},
		{0, want{200, `"burst";r=1;t=2`, "", "2"}},
		{0, want{200, `"burst";r=0;t=3`, "", "3"}},
		{0, want{429, `"burst";r=0;t=1`, "1", "3"}},
		{300 * time.Millisecond, want{429, `"burst";r=0;t=1`, "1", "3"}}, // 0.7s rounds up to 1
		{700 * time.Millisecond, want{200, `"burst";r=0;t=3`, "", "3"}},
	}
	for i, st := range steps {
		clock.Advance(st.advance)
		rec := do(h, "192.0.2.1:1234")
		got := want{rec.Code, rec.Header().Get("RateLimit"), rec.Header().Get("Retry-After"), rec.Header().Get("X-RateLimit-Reset")}
		if got != st.want {
			t.Errorf("step %d: got %+v, want %+v", i, got, st.want)
		}
		if p := rec.Header().Get("RateLimit-Policy"); p != `"burst";q=3;w=3, "hourly";q=100;w=3600` {
			t.Errorf("step %d: RateLimit-Policy = %s", i, p)
		}
		if rec.Header().Get("X-RateLimit-Limit") != "3" {
			t.Errorf("step %d: X-RateLimit-Limit = %q", i, rec.Header().Get("X-RateLimit-Limit"))
		}
	}
}

func TestProblemBody(t *testing.T) {
	lim, _ := storetest.NewLimiter(t, floodgate.PerMinute(1).Named("per-minute"))
	h := httplimit.New(lim, &httplimit.Options{Cost: func(r *http.Request) int64 {
		if r.Header.Get("Cost") == "5" {
			return 5
		}
		return 1
	}}).Handler(ok)
	do(h, "192.0.2.1:1")
	for _, tt := range []struct {
		cost, retryAfter string
		detail           string
	}{
		{"1", "60", `rate limit policy "per-minute" exceeded; retry in 60 s`},
		{"5", "", `the request's cost 5 is more than policy "per-minute" admits at once (1); it can never be allowed`},
	} {
		rec := do(h, "192.0.2.1:1", "Cost", tt.cost)
		if rec.Code != 429 || rec.Header().Get("Content-Type") != "application/problem+json" || rec.Header().Get("Retry-After") != tt.retryAfter {
			t.Fatalf("cost %s: %d %v", tt.cost, rec.Code, rec.Header())
		}
		var p map[string]any
		if err := json.Unmarshal(rec.Body.Bytes(), &p); err != nil {
			t.Fatal(err)
		}
		if p["status"] != 429.0 || p["title"] != "Too Many Requests" || p["violated-policy"] != "per-minute" || p["detail"] != tt.detail {
			t.Errorf("cost %s: problem = %v", tt.cost, p)
		}
	}
}

func TestOnDeniedAndSkip(t *testing.T) {
	lim, _ := storetest.NewLimiter(t, floodgate.PerMinute(1))
	var denied httplimit.Denial
	h := httplimit.New(lim, &httplimit.Options{
		Skip: func(r *http.Request) bool { return r.URL.Query().Get("skip") == "1" },
		OnDenied: func(w http.ResponseWriter, r *http.Request, d httplimit.Denial) {
			denied = d
			w.WriteHeader(http.StatusTeapot)
		},
	}).Handler(ok)
	do(h, "192.0.2.1:1")
	if rec := do(h, "192.0.2.1:1"); rec.Code != http.StatusTeapot || rec.Header().Get("Retry-After") != "60" {
		t.Errorf("OnDenied: %d %v", rec.Code, rec.Header())
	}
	if denied.Key != "ip:192.0.2.1" || denied.Limit != "default" || denied.Cost != 1 || denied.Result.Allowed {
		t.Errorf("Denial = %+v", denied)
	}
	req := httptest.NewRequest("GET", "/x?skip=1", nil)
	req.RemoteAddr = "192.0.2.1:1"
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	if rec.Code != 200 || rec.Header().Get("RateLimit") != "" {
		t.Errorf("skipped request: %d %v", rec.Code, rec.Header())
	}
}

func TestStoreFailure(t *testing.T) {
	for _, tt := range []struct {
		failClosed bool
		status     int
	}{{false, 200}, {true, 503}} {
		var log bytes.Buffer
		lim, err := floodgate.NewLimiter(&stubStore{err: fmt.Errorf("%w: redis: connection refused", floodgate.ErrStore)}, []floodgate.Limit{floodgate.PerSecond(1)}, nil)
		if err != nil {
			t.Fatal(err)
		}
		h := httplimit.New(lim, &httplimit.Options{FailClosed: tt.failClosed, Logger: slog.New(slog.NewTextHandler(&log, nil))}).Handler(ok)
		// Every request fails the same way: the log says so a line a
		// second, not once a request.
		const requests = 100
		start := time.Now()
		for range requests {
			if rec := do(h, "192.0.2.1:1"); rec.Code != tt.status {
				t.Fatalf("FailClosed %v: status %d, want %d", tt.failClosed, rec.Code, tt.status)
			}
		}
		secs := time.Since(start).Seconds()
		if !strings.Contains(log.String(), "connection refused") {
			t.Errorf("FailClosed %v: the failure was not logged: %q", tt.failClosed, log.String())
		}
		if n := strings.Count(log.String(), "\n"); float64(n) > 1+secs {
			t.Errorf("FailClosed %v: %d requests in %.2fs logged %d lines, want one a second:\n%s", tt.failClosed, requests, secs, n, log.String())
		}
	}
}

func TestBadRequests(t *testing.T) {
	lim, _ := storetest.NewLimiter(t, floodgate.PerSecond(1))
	for name, opts := range map[string]*httplimit.Options{
		"negative cost": {Cost: func(*http.Request) int64 { return -1 }},
		"missing key":   {Key: httplimit.Header("X-API-Key", nil)},
		"key too long":  {Key: func(*http.Request) (string, error) { return strings.Repeat("k", floodgate.MaxKeyLen+1), nil }},
		"no address":    {Key: httplimit.ClientIP()},
	} {
		rec := do(httplimit.New(lim, opts).Handler(ok), "not an address")
		if rec.Code != 400 || rec.Header().Get("Content-Type") != "application/problem+json" {
			t.Errorf("%s: %d %s", name, rec.Code, rec.Body)
		}
	}
}

// The probe of the hardening issue: behind a proxy that appends only
// X-Forwarded-For, a client sending a fresh Forwarded header with every
// request got a fresh bucket each time. It now gets its own, shared one.
func TestForgedForwardedHeader(t *testing.T) {
	proxies, _ := httplimit.TrustedProxies("10.0.0.0/8")
	lim, _ := storetest.NewLimiter(t, floodgate.TokenBucket(1, time.Hour, 10))
	h := httplimit.New(lim, &httplimit.Options{Key: httplimit.ClientIP(proxies...)}).Handler(ok)
	passed := 0
	for i := range 30 {
		rec := do(h, "10.0.0.2:1234", "Forwarded", fmt.Sprintf("for=198.51.100.%d", i), "X-Forwarded-For", "203.0.113.7")
		if rec.Code == 200 {
			passed++
		}
	}
	if passed != 10 {
		t.Errorf("%d of 30 requests with forged Forwarded headers passed, want the burst of 10", passed)
	}
}

func TestClientIP(t *testing.T) {
	proxies, err := httplimit.TrustedProxies("10.0.0.0/8", "2001:db8:ffff::1")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := httplimit.TrustedProxies("10.0.0.0/33"); err == nil {
		t.Error("TrustedProxies accepted a bad prefix")
	}
	trusting, plain := httplimit.ClientIP(proxies...), httplimit.ClientIP()
	fwd, err := httplimit.ClientIPFromHeader("Forwarded", proxies...)
	if err != nil {
		t.Fatal(err)
	}
	realIP, err := httplimit.ClientIPFromHeader("x-real-ip", proxies...)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := httplimit.ClientIPFromHeader("X-Client-IP", proxies...); err == nil {
		t.Error("ClientIPFromHeader accepted a header no proxy standard writes")
	}
	tests := []struct {
		name   string
		key    httplimit.KeyFunc
		remote string
		hdr    []string
		want   string
	}{
		{"peer", plain, "192.0.2.1:5000", nil, "ip:192.0.2.1"},
		{"untrusted peer's header ignored", plain, "192.0.2.1:5000", []string{"X-Forwarded-For", "198.51.100.7"}, "ip:192.0.2.1"},
		{"untrusted peer, trusting key", trusting, "192.0.2.1:5000", []string{"X-Forwarded-For", "198.51.100.7"}, "ip:192.0.2.1"},
		{"trusted peer", trusting, "10.1.1.1:5000", []string{"X-Forwarded-For", "198.51.100.7"}, "ip:198.51.100.7"},
		{"spoofed left hop skipped", trusting, "10.1.1.1:5000", []string{"X-Forwarded-For", "1.2.3.4, 198.51.100.7, 10.2.2.2"}, "ip:198.51.100.7"},
		{"several header lines", trusting, "10.1.1.1:5000", []string{"X-Forwarded-For", "1.2.3.4", "X-Forwarded-For", "198.51.100.8"}, "ip:198.51.100.8"},
		{"all trusted: leftmost", trusting, "10.1.1.1:5000", []string{"X-Forwarded-For", "10.3.3.3, 10.2.2.2"}, "ip:10.3.3.3"},
		{"garbage hop: stop at proxy", trusting, "10.1.1.1:5000", []string{"X-Forwarded-For", "nonsense"}, "ip:10.1.1.1"},
		{"no header", trusting, "10.1.1.1:5000", nil, "ip:10.1.1.1"},
		// Only the configured header is read: a client behind proxies that
		// append X-Forwarded-For cannot pick its key with Forwarded.
		{"forged forwarded behind an xff proxy", trusting, "10.1.1.1:5000", []string{"Forwarded", "for=192.0.2.61", "X-Forwarded-For", "198.51.100.7"}, "ip:198.51.100.7"},
		{"forged forwarded, no xff", trusting, "10.1.1.1:5000", []string{"Forwarded", "for=192.0.2.61"}, "ip:10.1.1.1"},
		{"forwarded", fwd, "10.1.1.1:5000", []string{"Forwarded", `for=192.0.2.60;proto=http;by=203.0.113.43, for="[2001:db8:cafe::17]:4711"`}, "ip:2001:db8:cafe::/64"},
		{"forwarded proxy ignores forged xff", fwd, "10.1.1.1:5000", []string{"Forwarded", "for=192.0.2.61", "X-Forwarded-For", "198.51.100.7"}, "ip:192.0.2.61"},
		{"forwarded unknown", fwd, "10.1.1.1:5000", []string{"Forwarded", "for=unknown"}, "ip:10.1.1.1"},
		{"forwarded from an untrusted peer", fwd, "192.0.2.1:5000", []string{"Forwarded", "for=192.0.2.61"}, "ip:192.0.2.1"},
		// nginx: proxy_set_header X-Real-IP $remote_addr.
		{"x-real-ip", realIP, "10.1.1.1:5000", []string{"X-Real-IP", "198.51.100.9", "X-Forwarded-For", "1.2.3.4"}, "ip:198.51.100.9"},
		{"x-real-ip from an untrusted peer", realIP, "192.0.2.1:5000", []string{"X-Real-IP", "198.51.100.9"}, "ip:192.0.2.1"},
		{"x-real-ip garbage", realIP, "10.1.1.1:5000", []string{"X-Real-IP", "nonsense"}, "ip:10.1.1.1"},
		// A CDN (10.9.9.9) in front of a load balancer (10.1.1.1), both
		// trusted: the client sent a forged hop of its own first.
		{"cdn and lb", trusting, "10.1.1.1:5000", []string{"X-Forwarded-For", "6.6.6.6, 203.0.113.5, 10.9.9.9"}, "ip:203.0.113.5"},
		{"ipv6 peer by /64", plain, "[2001:db8:1:2:3:4:5:6]:443", nil, "ip:2001:db8:1:2::/64"},
		{"trusted ipv6 proxy", trusting, "[2001:db8:ffff::1]:443", []string{"X-Forwarded-For", "192.0.2.9"}, "ip:192.0.2.9"},
		{"mapped ipv4", plain, "[::ffff:192.0.2.1]:80", nil, "ip:192.0.2.1"},
	}
	for _, tt := range tests {
		req := httptest.NewRequest("GET", "/", nil)
		req.RemoteAddr = tt.remote
		for i := 0; i+1 < len(tt.hdr); i += 2 {
			req.Header.Add(tt.hdr[i], tt.hdr[i+1])
		}
		got, err := tt.key(req)
		if err != nil || got != tt.want {
			t.Errorf("%s: key = %q, %v; want %q", tt.name, got, err, tt.want)
		}
	}
}

func TestHeaderKey(t *testing.T) {
	key := httplimit.Header("x-api-key", httplimit.ClientIP())
	req := httptest.NewRequest("GET", "/", nil)
	req.RemoteAddr = "192.0.2.1:1"
	if got, _ := key(req); got != "ip:192.0.2.1" {
		t.Errorf("without the header: %q", got)
	}
	req.Header.Set("X-Api-Key", "abc")
	if got, _ := key(req); got != "X-Api-Key:abc" {
		t.Errorf("with the header: %q", got)
	}
}

// throttled/TestHTTPRateLimiter: the legacy header values, 429 and
// Retry-After for stubbed results. floodgate answers a store error with
// the failure policy (200 fail-open, 503 fail-closed), not throttled's 500.
func TestThrottledVector(t *testing.T) {
	var v struct {
		Steps []struct {
			Path   string `json:"path"`
			Expect struct {
				Status     int    `json:"status"`
				Limit      string `json:"X-Ratelimit-Limit"`
				Remaining  string `json:"X-Ratelimit-Remaining"`
				Reset      string `json:"X-Ratelimit-Reset"`
				RetryAfter string `json:"Retry-After"`
			} `json:"expect"`
		} `json:"steps"`
	}
	if err := json.Unmarshal(storetest.Vector(t, "throttled/TestHTTPRateLimiter"), &v); err != nil {
		t.Fatal(err)
	}
	stubs := map[string]*stubStore{
		"ok":    {res: core.Decision{Verdict: core.Verdict{Allowed: true, Remaining: 2, Reset: time.Minute.Microseconds()}}},
		"limit": {res: core.Decision{Verdict: core.Verdict{Allowed: false, Retry: time.Minute.Microseconds()}}},
		"error": {err: floodgate.ErrStore},
	}
	for _, st := range v.Steps {
		lim, _ := floodgate.NewLimiter(stubs[st.Path], []floodgate.Limit{floodgate.PerSecond(1)}, nil)
		h := httplimit.New(lim, &httplimit.Options{LegacyHeaders: true, FailClosed: true, Logger: slog.New(slog.DiscardHandler)}).Handler(ok)
		rec := do(h, "192.0.2.1:1")
		want := st.Expect.Status
		if st.Path == "error" {
			want = 503
		}
		if rec.Code != want {
			t.Errorf("%s: status %d, want %d", st.Path, rec.Code, want)
		}
		for name, w := range map[string]string{"X-RateLimit-Limit": st.Expect.Limit, "X-RateLimit-Remaining": st.Expect.Remaining, "X-RateLimit-Reset": st.Expect.Reset, "Retry-After": st.Expect.RetryAfter} {
			if w != "" && rec.Header().Get(name) != w {
				t.Errorf("%s: %s = %q, want %q", st.Path, name, rec.Header().Get(name), w)
			}
		}
	}
}

// No test leaves a goroutine behind.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestSettle charges an estimate before the handler and settles the real
// cost after it, from the cost header or from SetCost: a refund of what
// was charged too much, or a charge of what was missing, into debt.
func TestSettle(t *testing.T) {
	tests := []struct {
		name      string
		header    string // the handler's cost header, "" for none
		setCost   int64  // -1: the handler does not call SetCost
		remaining int64  // of 10, after the request
		full      time.Duration
	}{
		{"no report: the estimate stands", "", -1, 7, 0},
		{"header: less than the estimate", "1", -1, 9, 0},
		{"header: more than the estimate", "8", -1, 2, 0},
		{"header: into debt", "25", -1, 0, 25 * time.Second},
		{"header: debt beyond a quota waits it out", "33", -1, 0, 33 * time.Second},
		{"SetCost wins over the header", "8", 0, 10, 0},
		{"a bad header is ignored", "many", -1, 7, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			lim, _ := storetest.NewLimiter(t, floodgate.TokenBucket(1, time.Second, 10))
			mw := httplimit.New(lim, &httplimit.Options{
				Key:        func(*http.Request) (string, error) { return "k", nil },
				Cost:       func(*http.Request) int64 { return 3 },
				CostHeader: "X-Tokens-Used",
				Logger:     slog.New(slog.DiscardHandler),
			})
			h := mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if tt.header != "" {
					w.Header().Set("X-Tokens-Used", tt.header)
				}
				if tt.setCost >= 0 && !httplimit.SetCost(r, tt.setCost) {
					t.Error("SetCost found no settlement")
				}
			}))
			h.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest("GET", "/", nil))
			r, err := lim.Peek(context.Background(), "k")
			if err != nil || r.Remaining != tt.remaining || (tt.full != 0 && r.ResetAfter != tt.full) {
				t.Fatalf("after the request: %+v, %v; want %d remaining, full after %s", r, err, tt.remaining, tt.full)
			}
		})
	}
	if httplimit.SetCost(httptest.NewRequest("GET", "/", nil), 1) {
		t.Error("SetCost outside a settling middleware reported true")
	}
}
