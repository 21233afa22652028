package redisstore_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/floodgate/floodgate"
	"github.com/floodgate/floodgate/internal/testkit/redistest"
	"github.com/floodgate/floodgate/redisstore"
)

// TestTraceRedis: under a traced Limiter's recording span, a decision
// that goes to Redis has a span of its own, a child of the check's, with
// its script calls and the batch that carried it, alone or batched, and a
// group's too; one that the sampler drops has none, and neither has one
// answered by the denial cache.
func TestTraceRedis(t *testing.T) {
	srv := redistest.Start(t)
	tests := []struct {
		name    string
		sampled bool
		calls   func(context.Context, *floodgate.Limiter) error
		spans   int   // floodgate.redis spans
		batch   int64 // the largest db.operation.batch.size seen
	}{
		{"alone", true, func(ctx context.Context, l *floodgate.Limiter) error {
			_, err := l.Allow(ctx, "a")
			return err
		}, 1, 1},
		{"batched", true, func(ctx context.Context, l *floodgate.Limiter) error {
			var wg sync.WaitGroup
			for range 32 {
				wg.Go(func() { l.Allow(ctx, "b") })
			}
			wg.Wait()
			return nil
		}, 32, 0},
		// One call of the fast path, all or nothing, which counts each
		// request of the group as a decision.
		{"group", true, func(ctx context.Context, l *floodgate.Limiter) error {
			return floodgate.AllowGroup(ctx, []floodgate.Request{{Limiter: l, Key: "c", N: 1}, {Limiter: l, Key: "d", N: 1}}, true)
		}, 1, 2},
		{"cached denial", true, func(ctx context.Context, l *floodgate.Limiter) error {
			// Emptied, then denied by Redis, then by the cache.
			for _, n := range []int64{100, 1, 1} {
				if _, err := l.AllowN(ctx, "e", n); err != nil {
					return err
				}
			}
			return nil
		}, 2, 1},
		{"not sampled", false, func(ctx context.Context, l *floodgate.Limiter) error {
			_, err := l.Allow(ctx, "f")
			return err
		}, 0, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rec := tracetest.NewSpanRecorder()
			sampler := sdktrace.AlwaysSample()
			if !tt.sampled {
				sampler = sdktrace.NeverSample()
			}
			tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec), sdktrace.WithSampler(sampler))
			defer tp.Shutdown(context.Background())
			st := newStore(t, srv.Client(t), &redisstore.Options{Prefix: "trace:" + tt.name + ":", DenialCache: true})
			// Slow enough that no token comes back during the test, however
			// loaded the machine, so the cached denial stays cached.
			limits := []floodgate.Limit{floodgate.TokenBucket(10, time.Hour, 100)}
			// The denial cache answers only once the store hears the lifts;
			// wait for that on an untraced limiter, whose spans are not counted.
			waitLive(t, limiter(t, st, limits[0]))
			lim, err := floodgate.NewLimiter(st, limits, &floodgate.Options{TracerProvider: tp})
			if err != nil {
				t.Fatal(err)
			}
			if err := tt.calls(context.Background(), lim); err != nil {
				t.Fatal(err)
			}
			byID := map[[8]byte]sdktrace.ReadOnlySpan{}
			for _, s := range rec.Ended() {
				byID[s.SpanContext().SpanID()] = s
			}
			n, batch := 0, int64(0)
			for _, s := range rec.Ended() {
				if s.Name() != redisstore.SpanRedis {
					continue
				}
				n++
				parent := byID[s.Parent().SpanID()]
				if parent == nil || (parent.Name() != floodgate.SpanCheck && parent.Name() != floodgate.SpanGroup) {
					t.Errorf("floodgate.redis's parent %v, want the check's or the group's span", parent)
				}
				a := map[attribute.Key]attribute.Value{}
				for _, kv := range s.Attributes() {
					a[kv.Key] = kv.Value
				}
				if a[redisstore.AttrDBSystem].AsString() != "redis" || a[redisstore.AttrScriptCalls].AsInt64() != 1 {
					t.Errorf("attributes %v", s.Attributes())
				}
				batch = max(batch, a[redisstore.AttrBatchSize].AsInt64())
			}
			if n != tt.spans {
				t.Errorf("%d floodgate.redis spans, want %d", n, tt.spans)
			}
			if tt.batch > 0 && batch != tt.batch {
				t.Errorf("batch size %d, want %d", batch, tt.batch)
			}
			if tt.name == "batched" && batch < 1 {
				t.Errorf("batch size %d", batch)
			}
		})
	}
}
