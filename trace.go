package floodgate

import (
	"context"
	"errors"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/floodgate/floodgate/core"
)

// This file traces a Limiter's decisions with OpenTelemetry, when
// Options.TracerProvider asks for it. A Limiter without one has a nil
// tracing and takes none of these paths: a decision then costs one
// comparison more.

// TracerName is the name of the tracer that a Limiter gets from
// Options.TracerProvider: its spans' instrumentation scope.
const TracerName = "github.com/floodgate/floodgate"

// The span names of a traced Limiter (see Options.TracerProvider).
const (
	SpanCheck  = "floodgate.check"  // AllowN, Allow, Peek, each try of WaitN
	SpanCharge = "floodgate.charge" // Charge, and Settle's charges
	SpanRefund = "floodgate.refund" // Refund, and Settle's refund
	SpanReset  = "floodgate.reset"  // Reset
	SpanGroup  = "floodgate.group"  // AllowGroup
)

// The attributes of a traced Limiter's spans. OpenTelemetry's semantic
// conventions have none for rate limiting, so they are floodgate's own,
// but for error.type, which is the conventions'.
const (
	AttrKey        = attribute.Key("floodgate.key")         // the key, only with Options.TraceKeys
	AttrCost       = attribute.Key("floodgate.cost")        // the cost asked for
	AttrOutcome    = attribute.Key("floodgate.outcome")     // "allowed" or "denied"
	AttrLimitIndex = attribute.Key("floodgate.limit.index") // Result.Index
	AttrLimitName  = attribute.Key("floodgate.limit.name")  // Result.Name, when it has one
	AttrSource     = attribute.Key("floodgate.source")      // Result.Source: store, local, fail-open, fail-closed, cache, lease
	AttrOverridden = attribute.Key("floodgate.overridden")  // Result.Overridden
	AttrRemaining  = attribute.Key("floodgate.remaining")   // Result.Remaining
	AttrRetryAfter = attribute.Key("floodgate.retry_after") // Result.RetryAfter in µs, -1 for Never; only on a denial
	AttrGroupSize  = attribute.Key("floodgate.group.size")  // AllowGroup's requests
	AttrGroupAll   = attribute.Key("floodgate.group.all")   // AllowGroup's all
	AttrDenied     = attribute.Key("floodgate.denied")      // AllowGroup's requests denied
	AttrErrorType  = attribute.Key("error.type")            // on a failure: invalid_key, invalid_cost, closed, key, store, canceled, deadline_exceeded or _OTHER
)

// tracing is what a traced Limiter traces with.
type tracing struct {
	tracer trace.Tracer
	attrs  []attribute.KeyValue // Options.TraceAttributes
	keys   bool                 // Options.TraceKeys
	plain  *Limiter             // the traced Limiter, untraced
}

func newTracing(o *Options) *tracing {
	if o == nil || o.TracerProvider == nil {
		return nil
	}
	return &tracing{tracer: o.TracerProvider.Tracer(TracerName), attrs: o.TraceAttributes.ToSlice(), keys: o.TraceKeys}
}

// start starts the span of a call on key of cost n, a child of ctx's.
// A span that is not recording (not sampled) gets no attributes, which
// would cost their building for nothing.
func (t *tracing) start(ctx context.Context, name, key string, n int64, cost bool) (context.Context, trace.Span) {
	ctx, span := t.tracer.Start(ctx, name)
	if span.IsRecording() {
		span.SetAttributes(t.attrs...)
		if cost {
			span.SetAttributes(AttrCost.Int64(n))
		}
		if t.keys {
			span.SetAttributes(AttrKey.String(key))
		}
	}
	return ctx, span
}

// end records r, or err, on span and ends it.
func (t *tracing) end(span trace.Span, r *Result, err error) {
	if span.IsRecording() {
		if err != nil {
			failed(span, err)
		} else {
			setResult(span, r)
		}
	}
	span.End()
}

// setResult sets the attributes of r on span.
func setResult(span trace.Span, r *Result) {
	outcome := "allowed"
	if !r.Allowed {
		outcome = "denied"
	}
	attrs := [...]attribute.KeyValue{
		AttrOutcome.String(outcome),
		AttrLimitIndex.Int(r.Index),
		AttrSource.String(r.Source.String()),
		AttrOverridden.Bool(r.Overridden),
		AttrRemaining.Int64(r.Remaining),
		AttrLimitName.String(r.Name),
		AttrRetryAfter.Int64(retryMicros(r)),
	}
	n := len(attrs) - 2
	if r.Name != "" {
		n++
	} else {
		attrs[n] = attrs[n+1] // no name: the retry in its place
	}
	if !r.Allowed {
		n++
	}
	span.SetAttributes(attrs[:n]...)
}

func retryMicros(r *Result) int64 {
	if r.RetryAfter == Never {
		return -1
	}
	return r.RetryAfter.Microseconds()
}

// failed records err on span: its status, and error.type.
func failed(span trace.Span, err error) {
	span.SetStatus(codes.Error, err.Error())
	span.SetAttributes(AttrErrorType.String(ErrorType(err)))
}

// ErrorType names the kind of a Limiter's or a store's error as the
// error.type attribute of their spans has it, from a fixed set so that
// it can be grouped by: "invalid_key", "invalid_cost", "invalid_limit",
// "closed", "key" (a store failed on that key alone), "store",
// "canceled", "deadline_exceeded", or "_OTHER".
func ErrorType(err error) string {
	switch {
	case errors.Is(err, core.ErrInvalidKey):
		return "invalid_key"
	case errors.Is(err, core.ErrInvalidCost):
		return "invalid_cost"
	case errors.Is(err, core.ErrInvalidLimit), errors.Is(err, core.ErrNoLimits):
		return "invalid_limit"
	case errors.Is(err, core.ErrClosed):
		return "closed"
	case errors.Is(err, core.ErrKey):
		return "key"
	case errors.Is(err, core.ErrStore):
		return "store"
	case errors.Is(err, context.Canceled):
		return "canceled"
	case errors.Is(err, context.DeadlineExceeded):
		return "deadline_exceeded"
	}
	return "_OTHER"
}

// allowTraced is AllowN in a span.
func (l *Limiter) allowTraced(ctx context.Context, key string, n int64) (Result, error) {
	ctx, span := l.tr.start(ctx, SpanCheck, key, n, true)
	r, err := l.tr.plain.AllowN(ctx, key, n)
	l.tr.end(span, &r, err)
	return r, err
}

// decideTraced is Charge or Refund (do) in a span.
func (l *Limiter) decideTraced(ctx context.Context, name, key string, n int64, do func(context.Context, string, int64) (core.Decision, error)) (Result, error) {
	ctx, span := l.tr.start(ctx, name, key, n, true)
	var r Result
	d, err := do(ctx, key, n)
	if err == nil {
		r = result(l.specs, &d)
	}
	l.tr.end(span, &r, err)
	return r, err
}

// resetTraced is Reset in a span.
func (l *Limiter) resetTraced(ctx context.Context, key string) error {
	ctx, span := l.tr.start(ctx, SpanReset, key, 0, false)
	err := l.policy.Reset(ctx, key)
	if err != nil && span.IsRecording() {
		failed(span, err)
	}
	span.End()
	return err
}

// groupTraced is AllowGroup in a span, traced by the first request's
// Limiter, with its TraceAttributes; the outcome is "denied" when any
// request is. With TraceKeys, the keys are not recorded: a group has many.
func groupTraced(ctx context.Context, t *tracing, reqs []Request, all bool) error {
	ctx, span := t.tracer.Start(ctx, SpanGroup)
	err := allowGroup(ctx, reqs, all)
	if span.IsRecording() {
		span.SetAttributes(t.attrs...)
		span.SetAttributes(AttrGroupSize.Int(len(reqs)), AttrGroupAll.Bool(all))
		if err != nil {
			failed(span, err)
		} else {
			denied, overridden := 0, false
			src := SourceStore
			for i := range reqs {
				r := &reqs[i].Result
				if !r.Allowed {
					denied++
				}
				overridden = overridden || r.Overridden
				if r.Source != SourceStore {
					src = r.Source
				}
			}
			outcome := "allowed"
			if denied > 0 {
				outcome = "denied"
			}
			span.SetAttributes(AttrOutcome.String(outcome), AttrDenied.Int(denied), AttrSource.String(src.String()), AttrOverridden.Bool(overridden))
		}
	}
	span.End()
	return err
}
