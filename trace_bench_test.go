package floodgate_test

import (
	"context"
	"testing"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/floodgate/floodgate"
)

// BenchmarkTrace is a hot key's decision on the memory store untraced
// (off), and traced by the SDK sampling 1% and 100% of new traces. The
// spans go to a processor that drops them, so that the figures are the
// tracing's own, without an exporter's.
//
//	go test -run - -bench Trace -benchmem .
func BenchmarkTrace(b *testing.B) {
	for _, c := range []struct {
		name  string
		ratio float64 // < 0: untraced
	}{{"off", -1}, {"sampled=1%", 0.01}, {"sampled=100%", 1}} {
		b.Run(c.name, func(b *testing.B) {
			st := floodgate.NewMemoryStore(nil)
			b.Cleanup(func() { st.Close() })
			var opts floodgate.Options
			if c.ratio >= 0 {
				tp := sdktrace.NewTracerProvider(sdktrace.WithSampler(sdktrace.TraceIDRatioBased(c.ratio)), sdktrace.WithSpanProcessor(discard{}))
				b.Cleanup(func() { tp.Shutdown(context.Background()) })
				opts.TracerProvider = tp
			}
			lim, err := floodgate.NewLimiter(st, []floodgate.Limit{floodgate.TokenBucket(1e9, time.Second, 1e9)}, &opts)
			if err != nil {
				b.Fatal(err)
			}
			ctx := context.Background()
			b.ReportAllocs()
			for b.Loop() {
				lim.Allow(ctx, "hot")
			}
		})
	}
}

// discard is a span processor that drops every span.
type discard struct{}

func (discard) OnStart(context.Context, sdktrace.ReadWriteSpan) {}
func (discard) OnEnd(sdktrace.ReadOnlySpan)                     {}
func (discard) Shutdown(context.Context) error                  { return nil }
func (discard) ForceFlush(context.Context) error                { return nil }
