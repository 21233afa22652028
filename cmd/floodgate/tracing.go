package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/floodgate/floodgate/internal/lib/lograte"
)

// This file is serve's OpenTelemetry tracing: the flags, the standard
// OTEL_* environment variables, and the export of spans by OTLP over gRPC
// or HTTP. Tracing is off unless a collector is named (--otlp-endpoint,
// $OTEL_EXPORTER_OTLP_ENDPOINT, $OTEL_EXPORTER_OTLP_TRACES_ENDPOINT) or
// $OTEL_TRACES_EXPORTER says otlp; $OTEL_TRACES_EXPORTER=none and
// $OTEL_SDK_DISABLED=true keep it off whatever else is set.
//
// Nothing here may hold up a decision: a span that ends goes into a
// bounded queue without waiting (dropped, and counted, when it is full),
// and one goroutine exports the queue. An unreachable collector, a full
// queue, or OTEL_* values that are not understood are logged, a line a
// minute at most with a count, never failed on.

// traceFlags are serve's tracing flags.
type traceFlags struct {
	endpoint string // --otlp-endpoint: the collector's base URL
	protocol string // --otlp-protocol: grpc or http/protobuf
	ratio    string // --trace-ratio: the share of new traces sampled, "" for $OTEL_TRACES_SAMPLER's
	keys     bool   // --trace-keys
}

func (t *traceFlags) register(fs *flag.FlagSet, e *env) {
	fs.StringVar(&t.endpoint, "otlp-endpoint", "", "trace decisions and export the spans by OTLP to the collector at this URL (http://host:4318 with http/protobuf, to which /v1/traces is added, or http://host:4317 with grpc; https for TLS); default $OTEL_EXPORTER_OTLP_TRACES_ENDPOINT or $OTEL_EXPORTER_OTLP_ENDPOINT, and without any tracing is off")
	fs.StringVar(&t.protocol, "otlp-protocol", "", "OTLP transport: grpc or http/protobuf (default $OTEL_EXPORTER_OTLP_TRACES_PROTOCOL, $OTEL_EXPORTER_OTLP_PROTOCOL, else http/protobuf)")
	fs.StringVar(&t.ratio, "trace-ratio", "", "share of the requests traced, from 0 to 1, when the caller's traceparent did not decide (its sampled flag is followed); default as $OTEL_TRACES_SAMPLER and $OTEL_TRACES_SAMPLER_ARG say, else 1")
	fs.BoolVar(&t.keys, "trace-keys", e.bool("FLOODGATE_TRACE_KEYS", false), "record the keys in the decisions' spans; they may be personal data, so by default they are not ($FLOODGATE_TRACE_KEYS)")
}

// traceConfig is what the flags and the environment ask for.
type traceConfig struct {
	on       bool
	protocol string // grpc or http/protobuf
	endpoint string // the flag's URL, complete; "" for the exporter's own from the environment
	sampler  sdktrace.Sampler
	queue    queueConfig
	// ignored are the OTEL_* values not understood, each with why: the
	// default is used instead, and they are logged once.
	ignored []string
}

// queueConfig sizes the export queue: $OTEL_BSP_* as the OpenTelemetry
// specification defines them.
type queueConfig struct {
	size    int           // spans held at most (OTEL_BSP_MAX_QUEUE_SIZE, 2048)
	batch   int           // spans sent at most in one export (OTEL_BSP_MAX_EXPORT_BATCH_SIZE, 512)
	delay   time.Duration // between exports (OTEL_BSP_SCHEDULE_DELAY, 5s)
	timeout time.Duration // for one export (OTEL_BSP_EXPORT_TIMEOUT, 30s)
}

// config reads the flags and getenv (os.Getenv in serve). A bad flag is
// an error; a bad OTEL_* value is only noted in ignored, as the
// specification asks of SDKs.
func (t *traceFlags) config(getenv func(string) string) (*traceConfig, error) {
	c := &traceConfig{queue: queueConfig{size: 2048, batch: 512, delay: 5 * time.Second, timeout: 30 * time.Second}}
	ignore := func(name, why string) {
		c.ignored = append(c.ignored, fmt.Sprintf("%s=%q: %s", name, getenv(name), why))
	}
	env := func(name string) string { return strings.TrimSpace(getenv(name)) }

	// The protocol.
	switch {
	case t.protocol != "":
		if t.protocol != "grpc" && t.protocol != "http/protobuf" {
			return nil, fmt.Errorf("--otlp-protocol: %q is not grpc or http/protobuf", t.protocol)
		}
		c.protocol = t.protocol
	default:
		c.protocol = "http/protobuf"
	protocols: // the first set decides
		for _, name := range []string{"OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL"} {
			switch v := env(name); v {
			case "":
				continue
			case "grpc", "http/protobuf":
				c.protocol = v
			case "http/json":
				ignore(name, "not supported; http/protobuf is used")
			default:
				ignore(name, "not grpc or http/protobuf; http/protobuf is used")
			}
			break protocols
		}
	}

	// The endpoint, and whether to trace at all.
	if t.endpoint != "" {
		u, err := url.Parse(t.endpoint)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return nil, fmt.Errorf("--otlp-endpoint: %q is not an http:// or https:// URL with a host", t.endpoint)
		}
		if c.protocol == "http/protobuf" && strings.TrimSuffix(u.Path, "/") == "" {
			u.Path = "/v1/traces"
		}
		c.endpoint = u.String()
	}
	// An endpoint variable that is not a URL would leave the exporter on
	// its default quietly: it is said, and the default made explicit.
	for _, name := range []string{"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT"} {
		if v := env(name); v != "" && c.endpoint == "" {
			if u, err := url.Parse(v); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
				ignore(name, "not an http:// or https:// URL with a host; localhost is used")
				c.endpoint = "http://localhost:4318/v1/traces"
				if c.protocol == "grpc" {
					c.endpoint = "http://localhost:4317"
				}
			}
			break
		}
	}
	exporter := "" // unset
	for _, v := range strings.Split(env("OTEL_TRACES_EXPORTER"), ",") {
		switch v = strings.TrimSpace(v); v {
		case "":
		case "otlp", "none":
			if exporter != "otlp" {
				exporter = v
			}
		default:
			ignore("OTEL_TRACES_EXPORTER", fmt.Sprintf("exporter %q is not supported; only otlp and none are", v))
		}
	}
	disabled := false
	if v := env("OTEL_SDK_DISABLED"); v != "" {
		d, err := strconv.ParseBool(v)
		if err != nil {
			ignore("OTEL_SDK_DISABLED", "not true or false")
		}
		disabled = d
	}
	named := c.endpoint != "" || env("OTEL_EXPORTER_OTLP_ENDPOINT") != "" || env("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") != ""
	c.on = !disabled && exporter != "none" && (named || exporter == "otlp")

	// The sampler: parent-based unless asked otherwise, so that a caller
	// that traces decides, as OpenTelemetry's default does.
	ratio := 1.0
	if t.ratio != "" {
		r, err := strconv.ParseFloat(t.ratio, 64)
		if err != nil || r < 0 || r > 1 {
			return nil, fmt.Errorf("--trace-ratio: %q is not a number from 0 to 1", t.ratio)
		}
		c.sampler = sdktrace.ParentBased(sdktrace.TraceIDRatioBased(r))
	} else {
		name, arg := env("OTEL_TRACES_SAMPLER"), env("OTEL_TRACES_SAMPLER_ARG")
		if strings.HasSuffix(name, "traceidratio") && arg != "" {
			r, err := strconv.ParseFloat(arg, 64)
			if err != nil || r < 0 || r > 1 {
				ignore("OTEL_TRACES_SAMPLER_ARG", "not a number from 0 to 1; 1 is used")
			} else {
				ratio = r
			}
		}
		switch name {
		case "", "parentbased_always_on":
			c.sampler = sdktrace.ParentBased(sdktrace.AlwaysSample())
		case "always_on":
			c.sampler = sdktrace.AlwaysSample()
		case "always_off":
			c.sampler = sdktrace.NeverSample()
		case "parentbased_always_off":
			c.sampler = sdktrace.ParentBased(sdktrace.NeverSample())
		case "traceidratio":
			c.sampler = sdktrace.TraceIDRatioBased(ratio)
		case "parentbased_traceidratio":
			c.sampler = sdktrace.ParentBased(sdktrace.TraceIDRatioBased(ratio))
		default:
			ignore("OTEL_TRACES_SAMPLER", "not a sampler floodgate knows; parentbased_always_on is used")
			c.sampler = sdktrace.ParentBased(sdktrace.AlwaysSample())
		}
	}

	// The queue.
	for _, q := range []struct {
		name string
		to   *int
	}{{"OTEL_BSP_MAX_QUEUE_SIZE", &c.queue.size}, {"OTEL_BSP_MAX_EXPORT_BATCH_SIZE", &c.queue.batch}} {
		if v := env(q.name); v != "" {
			n, err := strconv.Atoi(v)
			if err != nil || n < 1 || n > 1<<20 {
				ignore(q.name, "not a whole number from 1 to 1048576")
				continue
			}
			*q.to = n
		}
	}
	c.queue.batch = min(c.queue.batch, c.queue.size)
	for _, q := range []struct {
		name string
		to   *time.Duration
	}{{"OTEL_BSP_SCHEDULE_DELAY", &c.queue.delay}, {"OTEL_BSP_EXPORT_TIMEOUT", &c.queue.timeout}} {
		if v := env(q.name); v != "" {
			ms, err := strconv.Atoi(v)
			if err != nil || ms < 1 {
				ignore(q.name, "not a positive number of milliseconds")
				continue
			}
			*q.to = time.Duration(ms) * time.Millisecond
		}
	}
	return c, nil
}

// tracer is serve's TracerProvider and what stops it.
type tracer struct {
	tp    *sdktrace.TracerProvider
	queue *exportQueue
}

// startTracing returns the TracerProvider that c asks for, exporting to
// its collector, or nil when tracing is off. It logs the OTEL_* values
// it ignored, once, with their count. It fails only when the exporter
// cannot be made (it does not connect: an unreachable collector is found
// and logged as spans are exported).
func startTracing(c *traceConfig, log *slog.Logger) (*tracer, error) {
	if len(c.ignored) > 0 {
		log.Warn("floodgate: OTEL_* settings not understood; their defaults are used", "count", len(c.ignored), "settings", strings.Join(c.ignored, "; "))
	}
	if !c.on {
		return nil, nil
	}
	// The SDK reports what it cannot pass to a processor through
	// OpenTelemetry's global handler: into serve's log, a line a minute;
	// but not while the provider is made, when it reports the OTEL_*
	// values that config reported already.
	errLog := lograte.New(time.Minute, nil)
	// Its own diagnostics too, at their levels (an error is one).
	otel.SetLogger(logr.FromSlogHandler(log.Handler()))
	var quiet atomic.Bool
	quiet.Store(true)
	otel.SetErrorHandler(otel.ErrorHandlerFunc(func(err error) {
		if !quiet.Load() {
			errLog.Log(context.Background(), log, slog.LevelWarn, "floodgate: OpenTelemetry error", "error", err.Error())
		}
	}))
	ctx := context.Background()
	var exp sdktrace.SpanExporter
	var err error
	if c.protocol == "grpc" {
		var opts []otlptracegrpc.Option
		if c.endpoint != "" {
			opts = append(opts, otlptracegrpc.WithEndpointURL(c.endpoint))
		}
		exp, err = otlptracegrpc.New(ctx, opts...)
	} else {
		var opts []otlptracehttp.Option
		if c.endpoint != "" {
			opts = append(opts, otlptracehttp.WithEndpointURL(c.endpoint))
		}
		exp, err = otlptracehttp.New(ctx, opts...)
	}
	if err != nil {
		return nil, fmt.Errorf("OTLP exporter: %w", err)
	}
	// The service's name is floodgate unless $OTEL_SERVICE_NAME or
	// $OTEL_RESOURCE_ATTRIBUTES say otherwise.
	res := resource.NewSchemaless(attribute.String("service.name", "floodgate"), attribute.String("service.version", getVersion()))
	fromEnv, err := resource.New(ctx, resource.WithFromEnv(), resource.WithTelemetrySDK())
	if err != nil {
		log.Warn("floodgate: OTEL_RESOURCE_ATTRIBUTES not understood in part; the rest is used", "error", err.Error())
	}
	if merged, err := resource.Merge(res, fromEnv); err == nil {
		res = merged
	}
	q := newExportQueue(exp, c.queue, log)
	tp := sdktrace.NewTracerProvider(sdktrace.WithResource(res), sdktrace.WithSampler(c.sampler), sdktrace.WithSpanProcessor(q))
	quiet.Store(false)
	return &tracer{tp: tp, queue: q}, nil
}

// shutdown exports what is queued and stops, within ctx.
func (t *tracer) shutdown(ctx context.Context) {
	if t != nil {
		t.tp.Shutdown(ctx)
	}
}

// exportQueue is the span processor: spans that end are queued, never
// waited for, and one goroutine exports them in batches. It replaces the
// SDK's batch processor to log a full queue and failed exports through
// serve's log, counted, rather than through OpenTelemetry's global
// handler, once each.
type exportQueue struct {
	exp   sdktrace.SpanExporter
	cfg   queueConfig
	log   *slog.Logger
	spans chan sdktrace.ReadOnlySpan
	// dropped counts the spans that found the queue full, until a line
	// says so; dropLog and failLog hold those lines to one a minute.
	dropped          atomic.Int64
	dropLog, failLog *lograte.Limiter
	flush            chan chan struct{}
	ctx              context.Context // the exports'; cancelled when Shutdown runs out of time
	cancel           context.CancelFunc
	stop             chan struct{}
	done             chan struct{}
	once             sync.Once
}

var _ sdktrace.SpanProcessor = (*exportQueue)(nil)

func newExportQueue(exp sdktrace.SpanExporter, cfg queueConfig, log *slog.Logger) *exportQueue {
	q := &exportQueue{exp: exp, cfg: cfg, log: log, spans: make(chan sdktrace.ReadOnlySpan, cfg.size),
		dropLog: lograte.New(time.Minute, nil), failLog: lograte.New(time.Minute, nil),
		flush: make(chan chan struct{}), stop: make(chan struct{}), done: make(chan struct{})}
	q.ctx, q.cancel = context.WithCancel(context.Background())
	go q.run()
	return q
}

// OnStart does nothing: spans are queued as they end.
func (q *exportQueue) OnStart(context.Context, sdktrace.ReadWriteSpan) {}

// OnEnd queues s for export, or drops and counts it when the queue is
// full. It never waits.
func (q *exportQueue) OnEnd(s sdktrace.ReadOnlySpan) {
	if !s.SpanContext().IsSampled() {
		return
	}
	select {
	case q.spans <- s:
	default:
		q.dropped.Add(1)
	}
}

// ForceFlush exports what is queued now, within ctx.
func (q *exportQueue) ForceFlush(ctx context.Context) error {
	ch := make(chan struct{})
	select {
	case q.flush <- ch:
	case <-q.done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
	select {
	case <-ch:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Shutdown exports what is queued and stops the goroutine, within ctx:
// when ctx ends first, the export under way is cut off.
func (q *exportQueue) Shutdown(ctx context.Context) error {
	q.once.Do(func() { close(q.stop) })
	select {
	case <-q.done:
	case <-ctx.Done():
		q.cancel()
		<-q.done
	}
	q.cancel()
	return q.exp.Shutdown(ctx)
}

func (q *exportQueue) run() {
	defer close(q.done)
	batch := make([]sdktrace.ReadOnlySpan, 0, q.cfg.batch)
	tick := time.NewTicker(q.cfg.delay)
	defer tick.Stop()
	// drain exports everything queued now.
	drain := func() {
		for {
			select {
			case s := <-q.spans:
				if batch = append(batch, s); len(batch) == q.cfg.batch {
					batch = q.export(batch)
				}
			default:
				batch = q.export(batch)
				return
			}
		}
	}
	for {
		select {
		case s := <-q.spans:
			if batch = append(batch, s); len(batch) == q.cfg.batch {
				batch = q.export(batch)
			}
		case <-tick.C:
			batch = q.export(batch)
		case ch := <-q.flush:
			drain()
			close(ch)
		case <-q.stop:
			drain()
			return
		}
	}
}

// export sends batch, logs a failure, reports the spans dropped since
// the last line, and returns batch emptied.
func (q *exportQueue) export(batch []sdktrace.ReadOnlySpan) []sdktrace.ReadOnlySpan {
	if len(batch) > 0 {
		ctx, cancel := context.WithTimeout(q.ctx, q.cfg.timeout)
		err := q.exp.ExportSpans(ctx, batch)
		cancel()
		if err != nil && !errors.Is(err, context.Canceled) {
			q.failLog.Log(context.Background(), q.log, slog.LevelWarn, "floodgate: trace export failed; its spans are dropped", "spans", len(batch), "error", err.Error())
		}
		clear(batch)
	}
	if q.dropped.Load() > 0 {
		if _, ok := q.dropLog.Allow(); ok {
			q.log.Warn("floodgate: trace export queue full; spans dropped", "dropped", q.dropped.Swap(0), "queue", q.cfg.size)
		}
	}
	return batch[:0]
}
