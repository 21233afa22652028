package main

import (
	"bytes"
	"context"
	"log/slog"
	"net"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
)

// TestTraceConfig: the flags and the OTEL_* variables turn tracing on or
// off and choose the transport and the sampler; a bad flag is an error,
// a bad variable only ignored, with why.
func TestTraceConfig(t *testing.T) {
	tests := []struct {
		name     string
		flags    traceFlags
		env      map[string]string
		on       bool
		protocol string
		endpoint string
		sampler  string // the sampler's Description, "" for any
		ignored  []string
		err      string
	}{
		{name: "off by default", protocol: "http/protobuf", sampler: "ParentBased{root:AlwaysOnSampler,"},
		{name: "flag", flags: traceFlags{endpoint: "http://127.0.0.1:4318"}, on: true, protocol: "http/protobuf", endpoint: "http://127.0.0.1:4318/v1/traces"},
		{name: "flag with a path", flags: traceFlags{endpoint: "https://collector:4318/custom"}, on: true, protocol: "http/protobuf", endpoint: "https://collector:4318/custom"},
		{name: "flag, grpc", flags: traceFlags{endpoint: "http://127.0.0.1:4317", protocol: "grpc"}, on: true, protocol: "grpc", endpoint: "http://127.0.0.1:4317"},
		{name: "env endpoint", env: map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4317", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}, on: true, protocol: "grpc"},
		{name: "traces endpoint and protocol first", env: map[string]string{"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://c:4318/v1/traces", "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/protobuf", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}, on: true, protocol: "http/protobuf"},
		{name: "exporter otlp alone", env: map[string]string{"OTEL_TRACES_EXPORTER": "otlp"}, on: true, protocol: "http/protobuf"},
		{name: "exporter none", flags: traceFlags{endpoint: "http://c:4318"}, env: map[string]string{"OTEL_TRACES_EXPORTER": "none"}, protocol: "http/protobuf", endpoint: "http://c:4318/v1/traces"},
		{name: "sdk disabled", env: map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318", "OTEL_SDK_DISABLED": "true"}, protocol: "http/protobuf"},
		{name: "ratio flag", flags: traceFlags{ratio: "0.25"}, protocol: "http/protobuf", sampler: "ParentBased{root:TraceIDRatioBased{0.25},"},
		{name: "ratio env", env: map[string]string{"OTEL_TRACES_SAMPLER": "traceidratio", "OTEL_TRACES_SAMPLER_ARG": "0.01"}, protocol: "http/protobuf", sampler: "TraceIDRatioBased{0.01}"},
		{name: "ratio flag over env", flags: traceFlags{ratio: "1"}, env: map[string]string{"OTEL_TRACES_SAMPLER": "always_off"}, protocol: "http/protobuf", sampler: "ParentBased{root:TraceIDRatioBased{1},"},
		{name: "always off", env: map[string]string{"OTEL_TRACES_SAMPLER": "always_off"}, protocol: "http/protobuf", sampler: "AlwaysOffSampler"},
		{name: "bad variables", env: map[string]string{
			"OTEL_TRACES_SAMPLER": "jaeger_remote", "OTEL_EXPORTER_OTLP_PROTOCOL": "http/json", "OTEL_TRACES_EXPORTER": "otlp,zipkin",
			"OTEL_BSP_MAX_QUEUE_SIZE": "-3", "OTEL_BSP_SCHEDULE_DELAY": "soon", "OTEL_SDK_DISABLED": "maybe",
		}, on: true, protocol: "http/protobuf", sampler: "ParentBased{root:AlwaysOnSampler,", ignored: []string{
			"OTEL_EXPORTER_OTLP_PROTOCOL", "OTEL_TRACES_EXPORTER", "OTEL_SDK_DISABLED", "OTEL_TRACES_SAMPLER", "OTEL_BSP_MAX_QUEUE_SIZE", "OTEL_BSP_SCHEDULE_DELAY",
		}},
		{name: "bad endpoint variable", env: map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "collector:4317", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}, on: true, protocol: "grpc",
			endpoint: "http://localhost:4317", ignored: []string{"OTEL_EXPORTER_OTLP_ENDPOINT"}},
		{name: "bad ratio variable", env: map[string]string{"OTEL_TRACES_SAMPLER": "parentbased_traceidratio", "OTEL_TRACES_SAMPLER_ARG": "2"}, protocol: "http/protobuf",
			sampler: "ParentBased{root:TraceIDRatioBased{1},", ignored: []string{"OTEL_TRACES_SAMPLER_ARG"}},
		{name: "bad protocol flag", flags: traceFlags{protocol: "udp"}, err: "--otlp-protocol"},
		{name: "bad endpoint flag", flags: traceFlags{endpoint: "collector:4317"}, err: "--otlp-endpoint"},
		{name: "bad ratio flag", flags: traceFlags{ratio: "1.5"}, err: "--trace-ratio"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := tt.flags.config(func(k string) string { return tt.env[k] })
			if tt.err != "" {
				if err == nil || !strings.Contains(err.Error(), tt.err) {
					t.Fatalf("error %v, want one about %s", err, tt.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if c.on != tt.on || c.protocol != tt.protocol || c.endpoint != tt.endpoint {
				t.Errorf("on %v, protocol %q, endpoint %q; want %v, %q, %q", c.on, c.protocol, c.endpoint, tt.on, tt.protocol, tt.endpoint)
			}
			if d := c.sampler.Description(); !strings.HasPrefix(d, tt.sampler) {
				t.Errorf("sampler %s, want %s", d, tt.sampler)
			}
			if len(c.ignored) != len(tt.ignored) {
				t.Fatalf("ignored %q, want %q", c.ignored, tt.ignored)
			}
			for i, name := range tt.ignored {
				if !strings.HasPrefix(c.ignored[i], name+"=") {
					t.Errorf("ignored[%d] = %q, want %s", i, c.ignored[i], name)
				}
			}
		})
	}
}

// stuckExporter blocks every export until released, then counts spans.
type stuckExporter struct {
	release chan struct{}
	mu      sync.Mutex
	spans   int
}

func (e *stuckExporter) ExportSpans(ctx context.Context, spans []sdktrace.ReadOnlySpan) error {
	select {
	case <-e.release:
	case <-ctx.Done():
		return ctx.Err()
	}
	e.mu.Lock()
	e.spans += len(spans)
	e.mu.Unlock()
	return nil
}

func (e *stuckExporter) Shutdown(context.Context) error { return nil }

// TestExportQueueNeverWaits: while the exporter is stuck (a collector
// that does not answer), ending spans never waits: those that find the
// queue full are dropped, counted, and said once in the log.
func TestExportQueueNeverWaits(t *testing.T) {
	var log bytes.Buffer
	exp := &stuckExporter{release: make(chan struct{})}
	q := newExportQueue(exp, queueConfig{size: 4, batch: 2, delay: time.Hour, timeout: time.Hour}, slog.New(slog.NewTextHandler(&log, nil)))
	sampled := trace.NewSpanContext(trace.SpanContextConfig{TraceID: trace.TraceID{1}, SpanID: trace.SpanID{1}, TraceFlags: trace.FlagsSampled})
	span := tracetest.SpanStub{Name: "floodgate.check", SpanContext: sampled}.Snapshot()
	unsampled := tracetest.SpanStub{Name: "floodgate.check"}.Snapshot()
	for range 100 {
		q.OnEnd(span) // the first two go out in a batch that sticks; four wait; the rest are dropped
		q.OnEnd(unsampled)
	}
	close(exp.release)
	if err := q.ForceFlush(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := q.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	exp.mu.Lock()
	exported := exp.spans
	exp.mu.Unlock()
	lines := strings.Split(strings.TrimSpace(log.String()), "\n")
	if len(lines) != 1 || !strings.Contains(lines[0], "trace export queue full") || !strings.Contains(lines[0], "dropped="+strconv.Itoa(100-exported)) {
		t.Errorf("exported %d; logged:\n%s\nwant one line with dropped=%d", exported, log.String(), 100-exported)
	}
	if exported < 4 || exported > 6 {
		t.Errorf("exported %d spans, want the queue's 4 and up to a batch of 2 more", exported)
	}
}

// TestTraceCollectorDown: with the collector unreachable and OTEL_*
// values that are not understood, serve decides every request, says
// once, with a count, what it ignored, says once that exports fail, and
// stops promptly on SIGTERM.
func TestTraceCollectorDown(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := "http://" + ln.Addr().String() // nothing answers once closed
	ln.Close()
	t.Setenv("OTEL_TRACES_SAMPLER", "bogus")
	t.Setenv("OTEL_BSP_MAX_QUEUE_SIZE", "many")
	t.Setenv("OTEL_BSP_SCHEDULE_DELAY", "20")
	for _, protocol := range []string{"grpc", "http/protobuf"} {
		t.Run(strings.ReplaceAll(protocol, "/", "-"), func(t *testing.T) {
			in := serve(t, "--otlp-endpoint", dead, "--otlp-protocol", protocol)
			for i := range 200 {
				if code, body := in.post(t, "/v1/check", `{"rule":"example","key":"k`+strconv.Itoa(i%50)+`"}`); code != 200 {
					t.Fatalf("check %d: %d %v", i, code, body)
				}
			}
			waitFor(t, "the export's failure in the log", func() bool { return strings.Contains(in.stderr.String(), "trace export failed") })
			if err := in.stop(t, syscall.SIGTERM); err != nil {
				t.Errorf("exit: %v\n%s", err, in.stderr)
			}
			log := in.stderr.String()
			if n := strings.Count(log, "OTEL_* settings not understood"); n != 1 || !strings.Contains(log, "count=2") {
				t.Errorf("the ignored settings were logged %d times, want once with count=2:\n%s", n, log)
			}
			if n := strings.Count(log, "trace export failed"); n != 1 {
				t.Errorf("the failed exports were logged %d times, want once:\n%s", n, log)
			}
		})
	}
}
