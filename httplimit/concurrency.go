package httplimit

import (
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strconv"
	"time"

	"github.com/floodgate/floodgate"
	"github.com/floodgate/floodgate/internal/lib/headers"
	"github.com/floodgate/floodgate/internal/lib/permithold"
)

// ErrPermitLost is the cause of a request's context when its
// concurrency permit could not be extended (it expired, or was released
// elsewhere): the handler should stop, as its slot may be someone else's.
var ErrPermitLost = errors.New("httplimit: the request's concurrency permit was lost")

// ConcurrencyOptions configures a ConcurrencyMiddleware. The zero value
// (or nil) gives the defaults.
type ConcurrencyOptions struct {
	// Key returns a request's key. Default: ClientIP() with no trusted
	// proxies.
	Key KeyFunc
	// Skip, when it returns true, lets a request through without a slot.
	Skip func(r *http.Request) bool
	// ExtendEvery is how often the permit of a request still running is
	// extended for another lease, for long requests (streams, exports).
	// Default: a third of the lease, so that two extends can fail before
	// the permit expires. A negative value never extends: a request that
	// runs longer than the lease then loses its slot when it expires.
	ExtendEvery time.Duration
	// Clock is what the extending waits on. Default:
	// floodgate.SystemClock().
	Clock floodgate.Clock
	// FailClosed answers 503 with Retry-After: 1 when the store fails.
	// Default: false, the request is served without a slot (fail open).
	FailClosed bool
	// Logger receives store failures, a line a second at most. Default:
	// slog.Default().
	Logger *slog.Logger
}

// ConcurrencyMiddleware bounds how many requests per key are in flight
// at once, across every process that shares the Concurrency's store: it
// acquires a slot before the handler runs and releases it when the
// handler returns, extending it meanwhile. A request that finds the key's
// slots full gets 429 Too Many Requests, with Retry-After (whole seconds,
// rounded up) saying when a slot frees at the latest. It is safe for
// concurrent use.
type ConcurrencyMiddleware struct {
	c      *floodgate.Concurrency
	holder *permithold.Holder
	gate
}

// NewConcurrency returns a ConcurrencyMiddleware that holds one of c's
// slots on the request's key while the handler runs.
func NewConcurrency(c *floodgate.Concurrency, opts *ConcurrencyOptions) *ConcurrencyMiddleware {
	var o ConcurrencyOptions
	if opts != nil {
		o = *opts
	}
	m := &ConcurrencyMiddleware{c: c, gate: newGate(o.Key, o.Skip, o.FailClosed, o.Logger, "concurrency", "serving without a slot")}
	m.holder = permithold.New(c, o.ExtendEvery, o.Clock, m.log, ErrPermitLost, "httplimit")
	return m
}

// Handler returns next wrapped by the middleware.
func (m *ConcurrencyMiddleware) Handler(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		key, ok := m.begin(w, r, next)
		if !ok {
			return
		}
		res, err := m.c.Acquire(r.Context(), key)
		if err != nil {
			m.failed(w, r, next, err)
			return
		}
		if !res.Allowed {
			s := headers.Seconds(res.RetryAfter)
			w.Header().Set(HeaderRetryAfter, strconv.FormatInt(s, 10))
			p := &problem{ViolatedPolicy: m.c.Name(), RetryAfter: &s,
				Detail: fmt.Sprintf("%d of %d requests in flight for this key; retry in %d s", res.Held, res.Limit, s)}
			writeProblem(w, http.StatusTooManyRequests, "Too Many Requests", "", p)
			return
		}
		ctx, end := m.holder.Hold(r.Context(), key, res.Permit)
		defer end()
		next.ServeHTTP(w, r.WithContext(ctx))
	})
}
