package grpclimit

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"time"

	"github.com/floodgate/floodgate"
	"github.com/floodgate/floodgate/internal/lib/headers"
	"github.com/floodgate/floodgate/internal/lib/permithold"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
)

// ErrPermitLost is the cause of a call's context when its concurrency
// permit could not be extended (it expired, or was released elsewhere):
// the handler should stop, as its slot may be someone else's.
var ErrPermitLost = errors.New("grpclimit: the call's concurrency permit was lost")

// ConcurrencyOptions configures the concurrency interceptors. The zero
// value (or nil) gives the defaults.
type ConcurrencyOptions struct {
	// Key returns a call's key. Default: PeerIP().
	Key KeyFunc
	// Skip, when it returns true, lets a call through without a slot.
	Skip func(ctx context.Context, fullMethod string) bool
	// ExtendEvery is how often the permit of a call still running (a
	// long stream) is extended for another lease. Default: a third of
	// the lease. A negative value never extends.
	ExtendEvery time.Duration
	// Clock is what the extending waits on. Default:
	// floodgate.SystemClock().
	Clock floodgate.Clock
	// FailClosed fails calls with codes.Unavailable when the store
	// fails. Default: false, the call is served without a slot.
	FailClosed bool
	// Logger receives store failures, a line a second at most. Default:
	// slog.Default().
	Logger *slog.Logger
}

type slots struct {
	c      *floodgate.Concurrency
	holder *permithold.Holder
	gate
}

func newSlots(c *floodgate.Concurrency, opts *ConcurrencyOptions) *slots {
	var o ConcurrencyOptions
	if opts != nil {
		o = *opts
	}
	s := &slots{c: c, gate: newGate(o.Key, o.Skip, o.FailClosed, o.Logger, "concurrency", "serving without a slot")}
	s.holder = permithold.New(c, o.ExtendEvery, o.Clock, s.log, ErrPermitLost, "grpclimit")
	return s
}

// hold acquires a slot for the call. It returns the context to run the
// call in and the function that ends the hold (stops extending and
// releases), or the status error to fail the call with; ctx and a no-op
// when the call goes without a slot.
func (s *slots) hold(ctx context.Context, method string) (context.Context, func(), error) {
	none := func() {}
	key, ok, err := s.begin(ctx, method)
	if !ok {
		if err != nil {
			return nil, nil, err
		}
		return ctx, none, nil
	}
	res, err := s.c.Acquire(ctx, key)
	if err != nil {
		if err = s.failed(err, method); err != nil {
			return nil, nil, err
		}
		return ctx, none, nil
	}
	if !res.Allowed {
		grpc.SetHeader(ctx, metadata.Pairs(MDRetryAfter, strconv.FormatInt(headers.Seconds(res.RetryAfter), 10)))
		st := status.New(codes.ResourceExhausted, fmt.Sprintf("%d of %d calls in flight for this key; retry in %s", res.Held, res.Limit, res.RetryAfter))
		st, _ = st.WithDetails(&errdetails.RetryInfo{RetryDelay: durationpb.New(res.RetryAfter)},
			&errdetails.QuotaFailure{Violations: []*errdetails.QuotaFailure_Violation{{Subject: key, Description: s.c.Name()}}})
		return nil, nil, st.Err()
	}
	cctx, end := s.holder.Hold(ctx, key, res.Permit)
	return cctx, end, nil
}

// UnaryConcurrencyInterceptor returns a unary server interceptor that
// holds one of c's slots on the call's key while the handler runs, and
// fails a call that finds them full with codes.ResourceExhausted, a
// RetryInfo detail (when a slot frees at the latest), a QuotaFailure
// detail naming the limit, and retry-after header metadata in whole
// seconds.
func UnaryConcurrencyInterceptor(c *floodgate.Concurrency, opts *ConcurrencyOptions) grpc.UnaryServerInterceptor {
	s := newSlots(c, opts)
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		cctx, end, err := s.hold(ctx, info.FullMethod)
		if err != nil {
			return nil, err
		}
		defer end()
		return handler(cctx, req)
	}
}

// StreamConcurrencyInterceptor is UnaryConcurrencyInterceptor for
// streams: the slot is held, and extended, until the handler returns.
func StreamConcurrencyInterceptor(c *floodgate.Concurrency, opts *ConcurrencyOptions) grpc.StreamServerInterceptor {
	s := newSlots(c, opts)
	return func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
		cctx, end, err := s.hold(ss.Context(), info.FullMethod)
		if err != nil {
			return err
		}
		defer end()
		return handler(srv, &ctxStream{ServerStream: ss, ctx: cctx})
	}
}

// ctxStream is a ServerStream whose Context is the held call's.
type ctxStream struct {
	grpc.ServerStream
	ctx context.Context
}

func (s *ctxStream) Context() context.Context { return s.ctx }
