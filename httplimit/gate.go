package httplimit

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"time"

	"github.com/floodgate/floodgate"
	"github.com/floodgate/floodgate/internal/lib/lograte"
)

// gate is what the rate and the concurrency middleware share: which
// requests they skip, how they key a request, and what they answer when
// their decision fails.
type gate struct {
	key        KeyFunc
	skip       func(r *http.Request) bool
	failClosed bool
	log        *slog.Logger
	kind       string // "rate" or "concurrency", in answers and log lines
	open       string // how fail open serves a request, in the log line
}

// newGate returns a gate with the defaults filled in: ClientIP() with no
// trusted proxies, and slog.Default(). The logger is held to a line a
// second, as a failing store fails every request.
func newGate(key KeyFunc, skip func(*http.Request) bool, failClosed bool, logger *slog.Logger, kind, open string) gate {
	if key == nil {
		key = ClientIP()
	}
	if logger == nil {
		logger = slog.Default()
	}
	return gate{key: key, skip: skip, failClosed: failClosed, kind: kind, open: open,
		log: slog.New(lograte.NewHandler(logger.Handler(), time.Second, nil))}
}

// begin returns r's key and true when the middleware is to decide on r.
// Otherwise r has been answered: served as it is when skipped, 400 when
// its key cannot be read.
func (g *gate) begin(w http.ResponseWriter, r *http.Request, next http.Handler) (string, bool) {
	if g.skip != nil && g.skip(r) {
		next.ServeHTTP(w, r)
		return "", false
	}
	key, err := g.key(r)
	if err != nil {
		writeProblem(w, http.StatusBadRequest, "Bad Request", err.Error(), nil)
		return "", false
	}
	return key, true
}

// failed answers a request whose decision failed with err.
func (g *gate) failed(w http.ResponseWriter, r *http.Request, next http.Handler, err error) {
	switch {
	case errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded):
		// The client went away or the server's deadline passed: nobody is
		// waiting for the answer.
		writeProblem(w, http.StatusServiceUnavailable, "Service Unavailable", "the request's context ended before the "+g.kind+" limit decision", nil)
	case floodgate.IsInvalidInput(err):
		writeProblem(w, http.StatusBadRequest, "Bad Request", err.Error(), nil)
	case g.failClosed:
		g.log.Error("httplimit: "+g.kind+" limit store failed; denying (fail closed)", "error", err.Error(), "path", r.URL.Path)
		w.Header().Set(HeaderRetryAfter, "1")
		writeProblem(w, http.StatusServiceUnavailable, "Service Unavailable", "the "+g.kind+" limiter is unavailable", nil)
	default:
		g.log.Error("httplimit: "+g.kind+" limit store failed; "+g.open+" (fail open)", "error", err.Error(), "path", r.URL.Path)
		next.ServeHTTP(w, r)
	}
}
