package grpclimit

import (
	"context"
	"errors"
	"log/slog"
	"time"

	"github.com/floodgate/floodgate"
	"github.com/floodgate/floodgate/internal/lib/lograte"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// gate is what the rate and the concurrency interceptors share: which
// calls they skip, how they key a call, and how they fail a call whose
// decision failed.
type gate struct {
	key        KeyFunc
	skip       func(ctx context.Context, fullMethod string) bool
	failClosed bool
	log        *slog.Logger
	kind       string // "rate" or "concurrency", in errors and log lines
	open       string // how fail open serves a call, in the log line
}

// newGate returns a gate with the defaults filled in: PeerIP(), and
// slog.Default(). The logger is held to a line a second, as a failing
// store fails every call.
func newGate(key KeyFunc, skip func(context.Context, string) bool, failClosed bool, logger *slog.Logger, kind, open string) gate {
	if key == nil {
		key = PeerIP()
	}
	if logger == nil {
		logger = slog.Default()
	}
	return gate{key: key, skip: skip, failClosed: failClosed, kind: kind, open: open,
		log: slog.New(lograte.NewHandler(logger.Handler(), time.Second, nil))}
}

// begin returns the call's key and true when the interceptor is to
// decide on it. Otherwise it returns false and the status error to fail
// the call with: nil when the call is skipped, to be served as it is.
func (g *gate) begin(ctx context.Context, method string) (string, bool, error) {
	if g.skip != nil && g.skip(ctx, method) {
		return "", false, nil
	}
	key, err := g.key(ctx, method)
	if err != nil {
		return "", false, status.Error(codes.InvalidArgument, err.Error())
	}
	return key, true, nil
}

// failed returns the status error to fail a call to method whose
// decision failed with err, or nil to serve it as it is (fail open).
func (g *gate) failed(err error, method string) error {
	switch {
	case errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded):
		return status.FromContextError(err).Err()
	case floodgate.IsInvalidInput(err):
		return status.Error(codes.InvalidArgument, err.Error())
	case g.failClosed:
		g.log.Error("grpclimit: "+g.kind+" limit store failed; denying (fail closed)", "error", err.Error(), "method", method)
		return status.Error(codes.Unavailable, g.kind+" limiter unavailable")
	default:
		g.log.Error("grpclimit: "+g.kind+" limit store failed; "+g.open+" (fail open)", "error", err.Error(), "method", method)
		return nil
	}
}
