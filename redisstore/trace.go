package redisstore

import (
	"context"
	"sync/atomic"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/floodgate/floodgate"
)

// This file traces the store's calls to Redis: under a recording span in
// the caller's context (a floodgate.Limiter's, with
// floodgate.Options.TracerProvider), a decision that goes to Redis gets a
// span of its own, SpanRedis, from the same TracerProvider. So the store
// needs no option of its own, and a store whose callers do not trace
// spends one context look-up a decision on it.

// SpanRedis is the name of the span of a decision that goes to Redis
// (Take, Charge, Refund; TakeGroup's group): from the moment it is asked
// for to its answer, its wait for a batch included.
const SpanRedis = "floodgate.redis"

// The attributes of SpanRedis. db.system.name and db.operation.batch.size
// are OpenTelemetry's semantic conventions for databases.
const (
	AttrDBSystem  = attribute.Key("db.system.name")          // "redis"
	AttrBatchSize = attribute.Key("db.operation.batch.size") // decisions in the script call that answered
	// AttrScriptCalls counts the script calls that carried the decision,
	// each a round trip of its own (on a Cluster, one of a pipeline's):
	// 1, or 2 when the fast path handed it on to decide.lua, or more when
	// an ACL refused a batch and its calls went again alone. The calls
	// that load the scripts again after a flush or a failover are not
	// counted.
	AttrScriptCalls = attribute.Key("floodgate.redis.script_calls")
	AttrErrorType   = floodgate.AttrErrorType
)

// spanKey is the context key of a call's storeSpan.
type spanKey struct{}

// storeSpan is a traced call's span and what its script calls add to it,
// from whichever goroutine sends them.
type storeSpan struct {
	span    trace.Span
	scripts atomic.Int64 // script calls that carried the call
	batch   atomic.Int64 // decisions in the last of them
}

// startSpan starts the SpanRedis of a call made with ctx when ctx's span
// is recording, and returns the context that carries it, which the call
// must be sent with; otherwise it returns ctx and nil.
func (s *Store) startSpan(ctx context.Context) (context.Context, *storeSpan) {
	parent := trace.SpanFromContext(ctx)
	if !parent.IsRecording() {
		return ctx, nil
	}
	s.traced.Store(true)
	ctx, span := parent.TracerProvider().Tracer(floodgate.TracerName).Start(ctx, SpanRedis, trace.WithSpanKind(trace.SpanKindClient))
	ss := &storeSpan{span: span}
	return context.WithValue(ctx, spanKey{}, ss), ss
}

// end records the call's script calls and err, and ends the span. ss may
// be nil: then it does nothing.
func (ss *storeSpan) end(err error) {
	if ss == nil {
		return
	}
	ss.span.SetAttributes(AttrDBSystem.String("redis"), AttrScriptCalls.Int64(ss.scripts.Load()),
		AttrBatchSize.Int64(ss.batch.Load()))
	if err != nil {
		ss.span.SetStatus(codes.Error, err.Error())
		ss.span.SetAttributes(AttrErrorType.String(floodgate.ErrorType(err)))
	}
	ss.span.End()
}

// traceSent counts a script call of decisions requests, which carries
// calls, in their spans, for those that have one. Until a call has been
// traced, it costs one atomic load.
func (s *Store) traceSent(calls []*call, decisions int) {
	if !s.traced.Load() {
		return
	}
	for _, c := range calls {
		if c.ctx == nil {
			continue
		}
		if ss, _ := c.ctx.Value(spanKey{}).(*storeSpan); ss != nil {
			ss.scripts.Add(1)
			ss.batch.Store(int64(decisions))
		}
	}
}
