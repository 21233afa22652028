// Package httplimit is net/http middleware that rate limits requests with
// a floodgate.Limiter and reports the limits in the standard header
// fields of draft-ietf-httpapi-ratelimit-headers-10:
//
//	RateLimit-Policy: "burst";q=100;w=60
//	RateLimit: "burst";r=99;t=1
//
// A denied request gets 429 Too Many Requests, a Retry-After in whole
// seconds (rounded up) and an application/problem+json body (RFC 9457)
// that names the violated policy. The limiter's store may fail; the
// middleware then follows its failure policy (serve the request, or 503),
// and never panics.
//
//	lim, _ := floodgate.New(floodgate.PerMinute(100).Named("api"))
//	mw := httplimit.New(lim, &httplimit.Options{Key: httplimit.ClientIP(proxies...)})
//	http.ListenAndServe(":8080", mw.Handler(mux))
package httplimit

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"strconv"

	"github.com/floodgate/floodgate"
	"github.com/floodgate/floodgate/internal/lib/headers"
)

// Options configures a Middleware. The zero value (or nil) gives the
// defaults.
type Options struct {
	// Key returns a request's key. Default: ClientIP() with no trusted
	// proxies, the connection's peer address.
	Key KeyFunc
	// Cost returns a request's cost, 1 by default. A negative cost is
	// answered with 400. With CostHeader or SetCost, it is the estimate
	// charged before the handler runs.
	Cost func(r *http.Request) int64
	// CostHeader, when set, names a response header in which the handler
	// reports the request's real cost (an LLM reply's tokens, say). When
	// the handler returns, the middleware settles the difference with the
	// estimate that Cost charged: it refunds what was charged too much
	// (Limiter.Refund), or charges what was missing even into debt
	// (Limiter.Charge), so that later requests wait, up to
	// floodgate.MaxSettleQuotas times the smallest limit's quota of debt
	// per request (Limiter.Settle). SetCost does the same
	// from inside the handler, and wins over the header.
	CostHeader string
	// Settle settles the real cost that handlers report with SetCost,
	// without a CostHeader. (A CostHeader implies it.)
	Settle bool
	// Skip, when it returns true, lets a request through unlimited and
	// without headers (health checks, internal callers).
	Skip func(r *http.Request) bool
	// LegacyHeaders adds X-RateLimit-Limit, X-RateLimit-Remaining and
	// X-RateLimit-Reset (seconds until the limit is full again) for the
	// clients that still read them.
	LegacyHeaders bool
	// FailClosed answers 503 Service Unavailable, with Retry-After: 1,
	// when the limiter's store fails. Default: false, the request is
	// served unlimited (fail open). Either way the error is logged. Wrap
	// the store in a fallback.Store to keep limiting through an outage.
	FailClosed bool
	// OnDenied, when set, writes the response to a denied request in
	// place of the default problem+json 429. The RateLimit and
	// Retry-After headers are already set when it is called.
	OnDenied func(w http.ResponseWriter, r *http.Request, d Denial)
	// Logger receives store failures, a line a second at most, counting
	// those held back ("suppressed"), as a failing store fails every
	// request. Default: slog.Default().
	Logger *slog.Logger
}

// Denial describes a denied request to Options.OnDenied.
type Denial struct {
	Result floodgate.Result
	Limit  string // the violated limit's name, as the headers spell it
	Key    string
	Cost   int64
}

// Middleware rate limits HTTP requests. It is safe for concurrent use.
type Middleware struct {
	lim    *floodgate.Limiter
	count  int     // how many limits lim applies
	policy string  // the RateLimit-Policy field value
	opts   Options // its Key, Skip, FailClosed and Logger are in gate
	gate
}

// New returns a Middleware that applies lim's limits to every request
// that Options.Skip does not skip.
func New(lim *floodgate.Limiter, opts *Options) *Middleware {
	limits := lim.Limits()
	m := &Middleware{lim: lim, count: len(limits), policy: headers.Policy(limits)}
	if opts != nil {
		m.opts = *opts
	}
	m.gate = newGate(m.opts.Key, m.opts.Skip, m.opts.FailClosed, m.opts.Logger, "rate", "serving unlimited")
	return m
}

// Handler returns next wrapped by the middleware.
func (m *Middleware) Handler(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		key, ok := m.begin(w, r, next)
		if !ok {
			return
		}
		cost := int64(1)
		if m.opts.Cost != nil {
			cost = m.opts.Cost(r)
		}
		res, err := m.lim.AllowN(r.Context(), key, cost)
		if err != nil {
			m.failed(w, r, next, err)
			return
		}
		h := w.Header()
		h.Set(HeaderPolicy, m.policy)
		h.Set(HeaderRateLimit, headers.RateLimit(res, m.count))
		if m.opts.LegacyHeaders {
			h.Set(HeaderLimit, strconv.FormatInt(res.Quota, 10))
			h.Set(HeaderRemaining, strconv.FormatInt(res.Remaining, 10))
			h.Set(HeaderReset, strconv.FormatInt(headers.Seconds(res.ResetAfter), 10))
		}
		if res.Allowed {
			if m.opts.CostHeader == "" && !m.opts.Settle {
				next.ServeHTTP(w, r)
				return
			}
			m.serveAndSettle(w, r, next, key, cost)
			return
		}
		d := Denial{Result: res, Limit: headers.Name(res.Name, res.Index, m.count), Key: key, Cost: cost}
		if res.RetryAfter != floodgate.Never {
			h.Set(HeaderRetryAfter, strconv.FormatInt(headers.Seconds(res.RetryAfter), 10))
		}
		if m.opts.OnDenied != nil {
			m.opts.OnDenied(w, r, d)
			return
		}
		writeDenial(w, d)
	})
}

// settleKey is the context key of a request's settlement.
type settleKey struct{}

// settlement is the real cost a handler reported with SetCost.
type settlement struct {
	cost int64
	set  bool
}

// SetCost reports the real cost of the request r, whose handler runs
// behind a Middleware with Settle or a CostHeader: when the handler
// returns, the middleware refunds or charges the difference with the
// estimate it charged. It reports false when r is not behind such a
// middleware. A negative cost counts as 0.
func SetCost(r *http.Request, cost int64) bool {
	st, ok := r.Context().Value(settleKey{}).(*settlement)
	if ok {
		st.cost, st.set = max(cost, 0), true
	}
	return ok
}

// serveAndSettle serves an allowed request and settles its real cost.
func (m *Middleware) serveAndSettle(w http.ResponseWriter, r *http.Request, next http.Handler, key string, estimate int64) {
	st := &settlement{}
	next.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), settleKey{}, st)))
	real := estimate
	switch {
	case st.set:
		real = st.cost
	case m.opts.CostHeader != "":
		if v := w.Header().Get(m.opts.CostHeader); v != "" {
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil || n < 0 {
				m.log.Warn("httplimit: ignoring a bad cost header", "header", m.opts.CostHeader, "value", v)
				return
			}
			real = n
		}
	}
	// The request's own context may be gone (the client left); the cost
	// was still incurred.
	if real == estimate {
		return
	}
	if _, err := m.lim.Settle(context.WithoutCancel(r.Context()), key, estimate, real); err != nil {
		m.log.Error("httplimit: settling a request's cost failed", "key", key, "estimate", estimate, "cost", real, "error", err.Error())
	}
}

// problem is an RFC 9457 problem details object.
type problem struct {
	Type           string `json:"type"`
	Title          string `json:"title"`
	Status         int    `json:"status"`
	Detail         string `json:"detail,omitempty"`
	ViolatedPolicy string `json:"violated-policy,omitempty"`
	RetryAfter     *int64 `json:"retry-after,omitempty"`
}

func writeDenial(w http.ResponseWriter, d Denial) {
	p := &problem{ViolatedPolicy: d.Limit}
	if d.Result.RetryAfter == floodgate.Never {
		p.Detail = fmt.Sprintf("the request's cost %d is more than policy %q admits at once (%d); it can never be allowed", d.Cost, d.Limit, d.Result.Quota)
	} else {
		s := headers.Seconds(d.Result.RetryAfter)
		p.RetryAfter = &s
		p.Detail = fmt.Sprintf("rate limit policy %q exceeded; retry in %d s", d.Limit, s)
	}
	writeProblem(w, http.StatusTooManyRequests, "Too Many Requests", "", p)
}

// writeProblem writes an application/problem+json response.
func writeProblem(w http.ResponseWriter, status int, title, detail string, p *problem) {
	if p == nil {
		p = &problem{Detail: detail}
	}
	p.Type, p.Title, p.Status = "about:blank", title, status
	w.Header().Set("Content-Type", "application/problem+json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(p)
}
