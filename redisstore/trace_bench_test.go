package redisstore_test

import (
	"context"
	"strconv"
	"syscall"
	"testing"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/floodgate/floodgate"
	"github.com/floodgate/floodgate/internal/testkit/redistest"
	"github.com/floodgate/floodgate/redisstore"
)

// BenchmarkTraceRedis is BenchmarkRedisAllow's decisions untraced (off)
// and traced by the SDK sampling 1% and 100% of new traces, into a
// processor that drops the spans: the tracing's own cost, a span for the
// check and one for the Redis call, without an exporter's.
//
//	go test -run - -bench TraceRedis -benchmem ./redisstore
func BenchmarkTraceRedis(b *testing.B) {
	srv := redistest.Start(b)
	for _, c := range []struct {
		name  string
		ratio float64 // < 0: untraced
	}{{"off", -1}, {"sampled=1%", 0.01}, {"sampled=100%", 1}} {
		b.Run(c.name, func(b *testing.B) {
			var opts floodgate.Options
			if c.ratio >= 0 {
				tp := sdktrace.NewTracerProvider(sdktrace.WithSampler(sdktrace.TraceIDRatioBased(c.ratio)), sdktrace.WithSpanProcessor(discard{}))
				b.Cleanup(func() { tp.Shutdown(context.Background()) })
				opts.TracerProvider = tp
			}
			benchRedisAllow(b, srv, &opts)
		})
	}
}

// benchRedisAllow is 8 goroutines (4 a processor on two) deciding on 1,000
// keys, on a store with the defaults, through a Limiter with opts.
func benchRedisAllow(b *testing.B, srv *redistest.Server, opts *floodgate.Options) {
	st := newStore(b, srv.Client(b), &redisstore.Options{Prefix: "bench" + strconv.Itoa(b.N) + ":"})
	lim, err := floodgate.NewLimiter(st, []floodgate.Limit{floodgate.TokenBucket(1_000_000, time.Second, 1_000_000_000)}, opts)
	if err != nil {
		b.Fatal(err)
	}
	keys := make([]string, 1000)
	for i := range keys {
		keys[i] = "key" + strconv.Itoa(i)
	}
	ctx := context.Background()
	b.ReportAllocs()
	b.SetParallelism(4)
	// The client's CPU time per decision, every goroutine's: unlike
	// ns/op, it does not count the waits for Redis, nor for a core on a
	// loaded machine, so it shows what the client's code costs.
	var before syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &before)
	defer func() {
		var after syscall.Rusage
		syscall.Getrusage(syscall.RUSAGE_SELF, &after)
		cpu := time.Duration(after.Utime.Nano() - before.Utime.Nano() + after.Stime.Nano() - before.Stime.Nano())
		b.ReportMetric(float64(cpu.Nanoseconds())/float64(b.N), "cpu-ns/op")
	}()
	b.RunParallel(func(pb *testing.PB) {
		i := 0
		for pb.Next() {
			if _, err := lim.Allow(ctx, keys[i%len(keys)]); err != nil {
				b.Error(err)
				return
			}
			i += 7
		}
	})
}

// discard is a span processor that drops every span.
type discard struct{}

func (discard) OnStart(context.Context, sdktrace.ReadWriteSpan) {}
func (discard) OnEnd(sdktrace.ReadOnlySpan)                     {}
func (discard) Shutdown(context.Context) error                  { return nil }
func (discard) ForceFlush(context.Context) error                { return nil }
