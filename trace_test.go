package floodgate_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/floodgate/floodgate"
	"github.com/floodgate/floodgate/storetest"
)

// tracedLimiter returns a Limiter of limits on a memory store on a fixed
// clock, traced with opts into the recorder it returns, which samples
// every span.
func tracedLimiter(t *testing.T, opts floodgate.Options, limits ...floodgate.Limit) (*floodgate.Limiter, *tracetest.SpanRecorder, *sdktrace.TracerProvider) {
	t.Helper()
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec), sdktrace.WithSampler(sdktrace.AlwaysSample()))
	t.Cleanup(func() { tp.Shutdown(context.Background()) })
	clock := storetest.NewClock(storetest.Base)
	st := floodgate.NewMemoryStore(&floodgate.MemoryOptions{Clock: clock, SweepInterval: -1})
	t.Cleanup(func() { st.Close() })
	opts.Clock = clock
	if opts.TracerProvider == nil {
		opts.TracerProvider = tp
	}
	lim, err := floodgate.NewLimiter(st, limits, &opts)
	if err != nil {
		t.Fatal(err)
	}
	return lim, rec, tp
}

func attrs(s sdktrace.ReadOnlySpan) map[attribute.Key]attribute.Value {
	m := map[attribute.Key]attribute.Value{}
	for _, kv := range s.Attributes() {
		m[kv.Key] = kv.Value
	}
	return m
}

// TestTraceCheck: each call of a traced Limiter is a span, a child of the
// context's, with the outcome, the limit that decided, the source and the
// override; the key only with TraceKeys.
func TestTraceCheck(t *testing.T) {
	rule := attribute.String("floodgate.rule", "api")
	tests := []struct {
		name  string
		keys  bool
		calls func(context.Context, *floodgate.Limiter) error
		span  string
		want  map[attribute.Key]any // a value of nil: the attribute is absent
		err   string                // error.type, "" when it succeeds
	}{
		{"allowed", false, func(ctx context.Context, l *floodgate.Limiter) error {
			_, err := l.AllowN(ctx, "user:1", 2)
			return err
		}, floodgate.SpanCheck, map[attribute.Key]any{
			floodgate.AttrOutcome: "allowed", floodgate.AttrLimitIndex: int64(1), floodgate.AttrLimitName: "hourly",
			floodgate.AttrSource: "store", floodgate.AttrOverridden: false, floodgate.AttrCost: int64(2),
			floodgate.AttrRemaining: int64(3), floodgate.AttrRetryAfter: nil, floodgate.AttrKey: nil, "floodgate.rule": "api",
		}, ""},
		{"denied", false, func(ctx context.Context, l *floodgate.Limiter) error {
			for range 5 {
				if _, err := l.Allow(ctx, "user:1"); err != nil {
					return err
				}
			}
			_, err := l.Allow(ctx, "user:1")
			return err
		}, floodgate.SpanCheck, map[attribute.Key]any{
			floodgate.AttrOutcome: "denied", floodgate.AttrLimitIndex: int64(1), floodgate.AttrLimitName: "hourly",
			floodgate.AttrRemaining: int64(0), floodgate.AttrRetryAfter: int64(720_000_000),
		}, ""},
		{"never", false, func(ctx context.Context, l *floodgate.Limiter) error {
			_, err := l.AllowN(ctx, "user:1", 11)
			return err
		}, floodgate.SpanCheck, map[attribute.Key]any{floodgate.AttrOutcome: "denied", floodgate.AttrRetryAfter: int64(-1)}, ""},
		{"keys", true, func(ctx context.Context, l *floodgate.Limiter) error {
			_, err := l.Peek(ctx, "user:1")
			return err
		}, floodgate.SpanCheck, map[attribute.Key]any{floodgate.AttrKey: "user:1", floodgate.AttrCost: int64(0)}, ""},
		{"unnamed", false, func(ctx context.Context, l *floodgate.Limiter) error {
			_, err := l.Charge(ctx, "user:1", 10) // the per-second limit is the closer now
			return err
		}, floodgate.SpanCharge, map[attribute.Key]any{floodgate.AttrLimitIndex: int64(0), floodgate.AttrLimitName: nil}, ""},
		{"invalid key", true, func(ctx context.Context, l *floodgate.Limiter) error {
			_, err := l.Allow(ctx, "")
			return err
		}, floodgate.SpanCheck, map[attribute.Key]any{floodgate.AttrOutcome: nil}, "invalid_key"},
		{"overridden", false, func(ctx context.Context, l *floodgate.Limiter) error {
			if err := l.SetOverride(ctx, "user:1", floodgate.Override{Limits: []floodgate.Limit{floodgate.PerSecond(100)}}, 0); err != nil {
				return err
			}
			_, err := l.Allow(ctx, "user:1")
			return err
		}, floodgate.SpanCheck, map[attribute.Key]any{floodgate.AttrOverridden: true, floodgate.AttrRemaining: int64(99)}, ""},
		{"charge", false, func(ctx context.Context, l *floodgate.Limiter) error {
			_, err := l.Charge(ctx, "user:1", 4)
			return err
		}, floodgate.SpanCharge, map[attribute.Key]any{floodgate.AttrOutcome: "allowed", floodgate.AttrCost: int64(4)}, ""},
		{"refund", false, func(ctx context.Context, l *floodgate.Limiter) error {
			_, err := l.Refund(ctx, "user:1", 1)
			return err
		}, floodgate.SpanRefund, map[attribute.Key]any{floodgate.AttrOutcome: "allowed"}, ""},
		{"reset", true, func(ctx context.Context, l *floodgate.Limiter) error {
			return l.Reset(ctx, "user:1")
		}, floodgate.SpanReset, map[attribute.Key]any{floodgate.AttrKey: "user:1", floodgate.AttrCost: nil}, ""},
		{"group", true, func(ctx context.Context, l *floodgate.Limiter) error {
			reqs := []floodgate.Request{{Limiter: l, Key: "a", N: 1}, {Limiter: l, Key: "b", N: 11}}
			return floodgate.AllowGroup(ctx, reqs, true)
		}, floodgate.SpanGroup, map[attribute.Key]any{floodgate.AttrOutcome: "denied", floodgate.AttrDenied: int64(2),
			floodgate.AttrGroupSize: int64(2), floodgate.AttrGroupAll: true, floodgate.AttrKey: nil, "floodgate.rule": "api"}, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			lim, rec, tp := tracedLimiter(t, floodgate.Options{TraceAttributes: attribute.NewSet(rule), TraceKeys: tt.keys},
				floodgate.PerSecond(10), floodgate.TokenBucket(5, time.Hour, 5).Named("hourly"))
			ctx, parent := tp.Tracer("test").Start(context.Background(), "request")
			err := tt.calls(ctx, lim)
			parent.End()
			if (err != nil) != (tt.err != "") {
				t.Fatalf("error = %v, want one of type %q", err, tt.err)
			}
			spans := rec.Ended()
			last := spans[len(spans)-2] // the call's, before the parent's
			if last.Name() != tt.span {
				t.Fatalf("span %q, want %q", last.Name(), tt.span)
			}
			if last.Parent().SpanID() != parent.SpanContext().SpanID() || last.SpanContext().TraceID() != parent.SpanContext().TraceID() {
				t.Errorf("span's parent %v, want the context's %v", last.Parent(), parent.SpanContext())
			}
			got := attrs(last)
			for k, want := range tt.want {
				v, ok := got[k]
				switch {
				case want == nil && ok:
					t.Errorf("%s = %v, want none", k, v.String())
				case want != nil && (!ok || v.AsInterface() != want):
					t.Errorf("%s = %v, want %v", k, v.AsInterface(), want)
				}
			}
			if tt.err != "" {
				if last.Status().Code != codes.Error || got[floodgate.AttrErrorType].AsString() != tt.err {
					t.Errorf("status %v, error.type %q; want an error of type %q", last.Status(), got[floodgate.AttrErrorType].AsString(), tt.err)
				}
			}
		})
	}
}

// TestTraceNotSampled: a span that the sampler drops records nothing, and
// the decision is the same.
func TestTraceNotSampled(t *testing.T) {
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec), sdktrace.WithSampler(sdktrace.NeverSample()))
	defer tp.Shutdown(context.Background())
	lim, _, _ := tracedLimiter(t, floodgate.Options{TracerProvider: tp}, floodgate.PerSecond(1))
	for i, want := range []bool{true, false} {
		r, err := lim.Allow(context.Background(), "k")
		if err != nil || r.Allowed != want {
			t.Errorf("call %d: %v, %v; want allowed %v", i, r.Allowed, err, want)
		}
	}
	if n := len(rec.Ended()); n != 0 {
		t.Errorf("%d spans recorded, want none", n)
	}
}

// TestTraceOffAllocs: a Limiter without a TracerProvider allocates
// nothing per decision, even with a span in the context; a traced one
// gives the same answers.
func TestTraceOffAllocs(t *testing.T) {
	lim, _, _ := newTestLimiter(t, floodgate.PerSecond(1000000))
	tp := sdktrace.NewTracerProvider()
	defer tp.Shutdown(context.Background())
	ctx, span := tp.Tracer("test").Start(context.Background(), "request")
	defer span.End()
	lim.Allow(ctx, "k")
	if n := testing.AllocsPerRun(100, func() { lim.Allow(ctx, "k") }); n != 0 {
		t.Errorf("untraced Allow: %v allocations, want 0", n)
	}
	var _ trace.TracerProvider = tp
}

// TestErrorType: each kind of error is named as error.type says.
func TestErrorType(t *testing.T) {
	tests := []struct {
		err  error
		want string
	}{
		{floodgate.ErrInvalidKey, "invalid_key"},
		{floodgate.ErrInvalidCost, "invalid_cost"},
		{floodgate.ErrInvalidLimit, "invalid_limit"},
		{floodgate.ErrClosed, "closed"},
		{floodgate.ErrKey, "key"},
		{floodgate.ErrStore, "store"},
		{context.Canceled, "canceled"},
		{context.DeadlineExceeded, "deadline_exceeded"},
		{errors.New("other"), "_OTHER"},
	}
	for _, tt := range tests {
		if got := floodgate.ErrorType(tt.err); got != tt.want {
			t.Errorf("ErrorType(%v) = %q, want %q", tt.err, got, tt.want)
		}
	}
}
