// Package httpapi is the HTTP/JSON API of floodgate serve:
//
//	POST /v1/check        {"rule":"api","key":"user:1","cost":1}
//	POST /v1/check/batch  {"checks":[{"rule":...,"key":...,"cost":...}, ...]}
//	POST /v1/reset        {"rule":"api","key":"user:1"}
//	GET  /v1/rules
//	GET  /v1/inspect?rule=api&key=user:1   a key's state, without charging it
//	GET  /v1/explain?rule=api&key=user:1   why the key is decided as it is, without charging it
//	POST /v1/explain/envoy                 the same for an Envoy request (Options.EnvoyExplain)
//	ANY  /v1/auth/{rule}?key={ip}&deny=403  forward auth for nginx, Caddy, Traefik
//	GET  /v1/dashboard, /ui/               the dashboard (package dash)
//	POST /json                             Envoy's RateLimitRequest in JSON (Options.Envoy)
//	GET  /metrics, /healthz, /readyz, /healthcheck (envoyproxy/ratelimit's)
//
// A denial is a 200 with "allowed": false, except at /v1/auth, where it
// is the status the proxy asked for (forwardauth.go); other 4xx answers
// mean the request was wrong, 503 that the store failed. Errors are application/problem+json.
// POST bodies must be application/json (415 otherwise, so that a web page
// cannot post to the API as a form); a wrong method gets 405 with Allow; a
// body that does not arrive in time gets 408. Every JSON body, /json's and
// overrides' too, must be UTF-8 text: one with bytes that are not UTF-8,
// or an escaped lone surrogate, gets 400 rather than keys read as U+FFFD.
package httpapi

import (
	"bytes"
	"context"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"mime"
	"net/http"
	"net/netip"
	"strings"
	"time"

	"github.com/floodgate/floodgate"
	"github.com/floodgate/floodgate/internal/lib/arith"
	"github.com/floodgate/floodgate/internal/lib/clientip"
	"github.com/floodgate/floodgate/internal/lib/httpjson"
	"github.com/floodgate/floodgate/internal/lib/logctx"
	"github.com/floodgate/floodgate/internal/lib/lograte"
	"github.com/floodgate/floodgate/internal/server/dash"
	"github.com/floodgate/floodgate/internal/server/service"
)

// The bounds on requests.
const (
	MaxBody  = 1 << 20 // bytes of a request body
	MaxBatch = 1000    // checks in one batch
)

// Options configures the API. The zero value (or nil) gives the defaults.
type Options struct {
	// Token, when set, is required as "Authorization: Bearer <token>" on
	// every /v1/ endpoint (the scheme in any case). /healthz and /readyz
	// stay open; /metrics too unless ProtectMetrics is set.
	Token string
	// ProtectMetrics requires the Token on /metrics as well.
	ProtectMetrics bool
	// Dashboard, when set, is served at /ui/ (and GET / redirects there),
	// fed by GET /v1/dashboard, which requires the Token like /v1/.
	Dashboard *dash.Dashboard
	// Logger receives store failures, a line a second at most, counting
	// those held back ("suppressed"), as a failing store fails every
	// request; with the request's context, which carries the trace id of
	// a valid traceparent header (see logctx). Default: slog.Default().
	Logger *slog.Logger
	// TrustedProxies are the proxies whose client address header the
	// forward auth endpoint (/v1/auth) believes for {ip}. Default: none,
	// and {ip} is refused with 400.
	TrustedProxies []netip.Prefix
	// ClientIPHeader is that header: X-Forwarded-For (the default),
	// X-Real-IP or Forwarded.
	ClientIPHeader string
	// Envoy, when set, serves envoyproxy/ratelimit's POST /json
	// (envoy.Service.JSONHandler), behind the Token like /v1/. Default:
	// none, and /json is not found.
	Envoy http.Handler
	// EnvoyExplain, when set, serves POST /v1/explain/envoy
	// (envoy.Service.ExplainHandler), behind the Token like /v1/.
	// Default: none, and it is not found.
	EnvoyExplain http.Handler
}

type api struct {
	svc   *service.Service
	o     Options
	ip    *clientip.Resolver
	ipErr error // a ClientIPHeader that clientip refuses, told to {ip}'s users
}

// Handler returns the API's handler.
func Handler(svc *service.Service, opts *Options) http.Handler {
	var o Options
	if opts != nil {
		o = *opts
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	o.Logger = slog.New(lograte.NewHandler(o.Logger.Handler(), time.Second, nil))
	a := &api{svc: svc, o: o}
	a.ip, a.ipErr = clientip.New(o.ClientIPHeader, o.TrustedProxies)
	mux := http.NewServeMux()
	allow := map[string]string{} // path: the method it takes, for 405
	handle := func(method, path string, h http.HandlerFunc) {
		allow[path] = method
		if method == "GET" {
			allow[path] = "GET, HEAD"
		}
		mux.HandleFunc(method+" "+path, h)
	}
	handle("POST", "/v1/check", a.auth(a.check))
	handle("POST", "/v1/check/batch", a.auth(a.batch))
	handle("POST", "/v1/reset", a.auth(a.reset))
	handle("POST", "/v1/settle", a.auth(a.settle))
	handle("GET", "/v1/rules", a.auth(a.rules))
	handle("GET", "/v1/inspect", a.auth(a.inspect))
	handle("GET", "/v1/explain", a.auth(a.explain))
	// Concurrency rules (slots.go).
	handle("POST", "/v1/acquire", a.auth(a.slot("acquire")))
	handle("POST", "/v1/release", a.auth(a.slot("release")))
	handle("POST", "/v1/extend", a.auth(a.slot("extend")))
	if o.Envoy != nil {
		handle("POST", "/json", a.auth(o.Envoy.ServeHTTP))
	}
	if o.EnvoyExplain != nil {
		handle("POST", "/v1/explain/envoy", a.auth(jsonOnly(o.EnvoyExplain)))
	}
	// Forward auth takes any method: proxies ask with the original one
	// or with GET.
	mux.HandleFunc("/v1/auth", a.auth(a.forwardAuth))
	mux.HandleFunc("/v1/auth/{rule}", a.auth(a.forwardAuth))
	a.overrideRoutes(mux)
	if d := o.Dashboard; d != nil {
		handle("GET", "/v1/dashboard", a.auth(func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Cache-Control", "no-store")
			writeJSON(w, http.StatusOK, d.Snapshot())
		}))
		// The page's files hold no data: it asks for the token, and the
		// endpoints that feed it check it.
		assets := http.StripPrefix("/ui", dash.Assets())
		mux.Handle("GET /ui/", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Security-Policy", "default-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data:; frame-ancestors 'none'")
			w.Header().Set("X-Content-Type-Options", "nosniff")
			assets.ServeHTTP(w, r)
		}))
		mux.HandleFunc("GET /{$}", func(w http.ResponseWriter, r *http.Request) {
			http.Redirect(w, r, "/ui/", http.StatusFound)
		})
	}
	metrics := func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
		svc.Metrics.Write(w)
	}
	if o.ProtectMetrics {
		metrics = a.auth(metrics)
	}
	handle("GET", "/metrics", metrics)
	handle("GET", "/healthz", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, 200, map[string]any{"status": "ok"})
	})
	// envoyproxy/ratelimit's health check, which Envoy Gateway's and most
	// charts' probes ask: "OK" while the service serves, as there.
	handle("GET", "/healthcheck", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		io.WriteString(w, "OK")
	})
	handle("GET", "/readyz", func(w http.ResponseWriter, r *http.Request) {
		// Ready while decisions come from the configured store. In
		// fallback the service still answers, but a load balancer may
		// prefer an instance that reaches Redis.
		if svc.Ready() {
			writeJSON(w, 200, map[string]any{"status": "ready", "rules": len(svc.Config().Rules)})
			return
		}
		body := map[string]any{"status": "degraded: the Redis store is failing; decisions follow the fallback policy"}
		// The cause (a refused dial, a certificate Redis refused) spares
		// an operator a trip to the log.
		if fb := svc.Fallback(); fb != nil {
			if err := fb.Cause(); err != nil {
				body["cause"] = err.Error()
			}
		}
		writeJSON(w, 503, body)
	})
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		if methods, ok := allow[r.URL.Path]; ok {
			w.Header().Set("Allow", methods)
			problem(w, http.StatusMethodNotAllowed, r.Method+" is not allowed on "+r.URL.Path+"; use "+methods)
			return
		}
		problem(w, http.StatusNotFound, "no such endpoint: "+r.Method+" "+r.URL.Path+" (see GET /v1/rules, POST /v1/check)")
	})
	return traced(mux)
}

// traced passes to h the requests, with the trace id of their W3C
// traceparent header, when valid, in their context, for the log lines
// about them (logctx.NewHandler adds it to those).
func traced(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if id, ok := logctx.ParseTraceparent(r.Header.Get("Traceparent")); ok {
			r = r.WithContext(logctx.WithTraceID(r.Context(), id))
		}
		h.ServeHTTP(w, r)
	})
}

func (a *api) auth(h http.HandlerFunc) http.HandlerFunc {
	if a.o.Token == "" {
		return h
	}
	want := []byte(a.o.Token)
	return func(w http.ResponseWriter, r *http.Request) {
		// The scheme is case-insensitive (RFC 9110 section 11.1).
		scheme, token, _ := strings.Cut(strings.TrimSpace(r.Header.Get("Authorization")), " ")
		if !strings.EqualFold(scheme, "Bearer") || subtle.ConstantTimeCompare([]byte(strings.TrimSpace(token)), want) != 1 {
			w.Header().Set("WWW-Authenticate", `Bearer realm="floodgate"`)
			problem(w, http.StatusUnauthorized, "missing or wrong bearer token")
			return
		}
		h(w, r)
	}
}

// CheckRequest is one check.
type CheckRequest struct {
	Rule string `json:"rule"`
	Key  string `json:"key"`
	Cost *int64 `json:"cost,omitempty"` // default 1; 0 peeks
}

// CheckResponse is the answer to one check. Times are milliseconds,
// rounded up; retry_after_ms is 0 when allowed and -1 when the cost can
// never be allowed.
type CheckResponse struct {
	Rule         string `json:"rule"`
	Allowed      bool   `json:"allowed"`
	Limit        int64  `json:"limit"`
	Remaining    int64  `json:"remaining"`
	RetryAfterMs int64  `json:"retry_after_ms"`
	ResetAfterMs int64  `json:"reset_after_ms"`
	Policy       string `json:"policy,omitempty"` // the limit's name, when it has one
	Shadow       bool   `json:"shadow,omitempty"` // a shadow rule: allowed whatever it decided
	WouldDeny    bool   `json:"would_deny,omitempty"`
	Source       string `json:"source"`               // store, local, fail-open or fail-closed
	Overridden   bool   `json:"overridden,omitempty"` // the key has an override: limit and policy are its
	Error        string `json:"error,omitempty"`
	Status       int    `json:"status,omitempty"` // in a batch: the HTTP status this check alone would get
}

func ms(d floodgate.Result) (retry, reset int64) {
	return arith.RoundUp(d.RetryAfter, time.Millisecond), arith.RoundUp(d.ResetAfter, time.Millisecond)
}

func (a *api) decide(ctx context.Context, c CheckRequest) (CheckResponse, int) {
	cost := int64(1)
	if c.Cost != nil {
		cost = *c.Cost
	}
	d, err := a.svc.Check(ctx, c.Rule, c.Key, cost)
	if err != nil {
		status := statusOf(err)
		if status >= 500 && !errors.Is(err, floodgate.ErrKey) { // the service logs those
			a.o.Logger.ErrorContext(ctx, "floodgate: check failed", "rule", c.Rule, "error", err.Error())
		}
		return CheckResponse{Rule: c.Rule, Error: err.Error(), Status: status}, status
	}
	return NewCheckResponse(d), http.StatusOK
}

// NewCheckResponse is the answer to a check that the service decided.
func NewCheckResponse(d service.Decision) CheckResponse {
	retry, reset := ms(d.Result)
	return CheckResponse{
		Rule: d.Rule, Allowed: d.Allowed, Limit: d.Result.Quota, Remaining: d.Result.Remaining,
		RetryAfterMs: retry, ResetAfterMs: reset, Policy: d.Limit,
		Shadow: d.Shadow, WouldDeny: d.Shadow && !d.Result.Allowed, Source: d.Result.Source.String(),
		Overridden: d.Result.Overridden,
	}
}

func statusOf(err error) int {
	switch {
	case errors.Is(err, service.ErrUnknownRule):
		return http.StatusNotFound
	case errors.Is(err, floodgate.ErrKey):
		// The key's Redis keys hold foreign data or an ACL refuses them:
		// the server's fault, and no retry helps until someone repairs
		// it, unlike a store that is unavailable for a while.
		return http.StatusInternalServerError
	case errors.Is(err, service.ErrBadRequest), floodgate.IsInvalidInput(err):
		return http.StatusBadRequest
	}
	// The store failed, or the request's context ended first.
	return http.StatusServiceUnavailable
}

func (a *api) check(w http.ResponseWriter, r *http.Request) {
	var c CheckRequest
	if !decode(w, r, &c) {
		return
	}
	resp, status := a.decide(r.Context(), c)
	resp.Status = 0
	if status != http.StatusOK {
		problem(w, status, resp.Error)
		return
	}
	writeJSON(w, http.StatusOK, resp)
}

func (a *api) batch(w http.ResponseWriter, r *http.Request) {
	var b struct {
		Checks []CheckRequest `json:"checks"`
	}
	if !decode(w, r, &b) {
		return
	}
	if len(b.Checks) == 0 || len(b.Checks) > MaxBatch {
		problem(w, http.StatusBadRequest, fmt.Sprintf("checks must hold 1 to %d checks, got %d", MaxBatch, len(b.Checks)))
		return
	}
	out := make([]CheckResponse, len(b.Checks))
	for i, c := range b.Checks {
		out[i], _ = a.decide(r.Context(), c)
	}
	writeJSON(w, http.StatusOK, map[string]any{"results": out})
}

// SettleRequest corrects a check's cost after the fact: the check was
// charged Charged (its cost), and the request really cost Cost.
type SettleRequest struct {
	Rule    string `json:"rule"`
	Key     string `json:"key"`
	Charged int64  `json:"charged"`
	Cost    int64  `json:"cost"`
}

// settle is POST /v1/settle: it refunds or charges the difference between
// what a check charged and the real cost, and answers the state after, as
// a check's answer.
func (a *api) settle(w http.ResponseWriter, r *http.Request) {
	var c SettleRequest
	if !decode(w, r, &c) {
		return
	}
	d, err := a.svc.Settle(r.Context(), c.Rule, c.Key, c.Charged, c.Cost)
	if err != nil {
		status := statusOf(err)
		if status >= 500 && !errors.Is(err, floodgate.ErrKey) { // the service logs those
			a.o.Logger.ErrorContext(r.Context(), "floodgate: settle failed", "rule", c.Rule, "error", err.Error())
		}
		problem(w, status, err.Error())
		return
	}
	writeJSON(w, http.StatusOK, NewCheckResponse(d))
}

func (a *api) reset(w http.ResponseWriter, r *http.Request) {
	var c CheckRequest
	if !decode(w, r, &c) {
		return
	}
	if err := a.svc.Reset(r.Context(), c.Rule, c.Key); err != nil {
		problem(w, statusOf(err), err.Error())
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// inspect answers GET /v1/inspect?rule=R&key=K: the key's state under the
// rule, as a check of cost 0 reports it, without counting as traffic.
func (a *api) inspect(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	d, err := a.svc.Peek(r.Context(), q.Get("rule"), q.Get("key"))
	if err != nil {
		problem(w, statusOf(err), err.Error())
		return
	}
	resp := NewCheckResponse(d)
	resp.Allowed, resp.WouldDeny = d.Result.Remaining > 0, false
	writeJSON(w, http.StatusOK, resp)
}

// RuleInfo describes a rule in GET /v1/rules.
type RuleInfo struct {
	Name   string      `json:"name"`
	Shadow bool        `json:"shadow,omitempty"`
	Limits []LimitInfo `json:"limits"`
}

// LimitInfo describes one limit of a rule.
type LimitInfo struct {
	Name      string `json:"name,omitempty"`
	Algorithm string `json:"algorithm"`
	Quota     int64  `json:"quota"`
	Rate      int64  `json:"rate"`
	PeriodMs  int64  `json:"period_ms"`
	Calendar  string `json:"calendar,omitempty"`
	Summary   string `json:"summary"`
}

func (a *api) rules(w http.ResponseWriter, r *http.Request) {
	cfg := a.svc.Config()
	out := make([]RuleInfo, 0, len(cfg.Rules))
	for _, rule := range cfg.Rules {
		out = append(out, RuleInfo{Name: rule.Name, Shadow: rule.Shadow, Limits: limitInfos(rule.Limits)})
	}
	writeJSON(w, http.StatusOK, map[string]any{"source": cfg.Source, "rules": out})
}

func limitInfos(limits []floodgate.Limit) []LimitInfo {
	out := make([]LimitInfo, 0, len(limits))
	for _, l := range limits {
		li := LimitInfo{Name: l.Name(), Algorithm: l.Algorithm().String(), Quota: l.Quota(), Rate: l.Rate(), PeriodMs: l.Period().Milliseconds(), Summary: l.String()}
		if unit, loc := l.Calendar(); unit != 0 {
			li.Calendar = unit.String() + " " + loc.String()
		}
		out = append(out, li)
	}
	return out
}

// decode reads a bounded JSON body into v, answering 4xx itself on error.
func decode(w http.ResponseWriter, r *http.Request, v any) bool {
	if mt, _, err := mime.ParseMediaType(r.Header.Get("Content-Type")); err != nil || mt != "application/json" {
		problem(w, http.StatusUnsupportedMediaType, "the body must be JSON, sent as Content-Type: application/json")
		return false
	}
	body, ok := readBody(w, r, MaxBody)
	if !ok {
		return false
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		problem(w, http.StatusBadRequest, "invalid JSON body: "+err.Error())
		return false
	}
	if dec.More() {
		problem(w, http.StatusBadRequest, "invalid JSON body: more than one value")
		return false
	}
	return true
}

// readBody reads a body of at most max bytes that is UTF-8 text (see
// checkUTF8), answering 4xx itself on error.
func readBody(w http.ResponseWriter, r *http.Request, max int64) ([]byte, bool) {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, max))
	if err != nil {
		var tooBig *http.MaxBytesError
		var timeout interface{ Timeout() bool }
		switch {
		case errors.As(err, &tooBig):
			problem(w, http.StatusRequestEntityTooLarge, fmt.Sprintf("the body is larger than %d bytes", max))
		case errors.As(err, &timeout) && timeout.Timeout():
			w.Header().Set("Connection", "close")
			problem(w, http.StatusRequestTimeout, "the request body did not arrive in time")
		default:
			// A failure to read the body: its text names the connection's
			// addresses, which are not the client's business.
			problem(w, http.StatusBadRequest, "the request body could not be read")
		}
		return nil, false
	}
	if err := checkUTF8(body); err != nil {
		problem(w, http.StatusBadRequest, err.Error())
		return nil, false
	}
	return body, true
}

// checkUTF8 and problem are httpjson's, under the names this package's
// handlers have always used.
var checkUTF8 = httpjson.CheckUTF8

func problem(w http.ResponseWriter, status int, detail string) { httpjson.Problem(w, status, detail) }

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(v)
}
