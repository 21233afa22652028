package logctx

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"testing"

	"go.opentelemetry.io/otel/trace"
)

func TestParseTraceparent(t *testing.T) {
	const trace = "4bf92f3577b34da6a3ce929d0e0e4736"
	tests := []struct {
		in   string
		want string // "": rejected
	}{
		{"00-" + trace + "-00f067aa0ba902b7-01", trace},
		{"00-" + trace + "-00f067aa0ba902b7-00", trace},
		{"01-" + trace + "-00f067aa0ba902b7-01-extra", trace}, // a later version's field
		{"01-" + trace + "-00f067aa0ba902b7-01", trace},
		{"00-" + trace + "-00f067aa0ba902b7-01-extra", ""}, // 00 has no more fields
		{"01-" + trace + "-00f067aa0ba902b7-01x", ""},
		{"ff-" + trace + "-00f067aa0ba902b7-01", ""}, // invalid version
		{"00-" + strings.ToUpper(trace) + "-00f067aa0ba902b7-01", ""},
		{"00-00000000000000000000000000000000-00f067aa0ba902b7-01", ""},
		{"00-" + trace + "-0000000000000000-01", ""},
		{"00-" + trace + "-00f067aa0ba902b7-0g", ""},
		{"00-" + trace[:31] + "-00f067aa0ba902b7-01", ""},
		{"00_" + trace + "-00f067aa0ba902b7-01", ""},
		{"", ""},
	}
	for _, tt := range tests {
		got, ok := ParseTraceparent(tt.in)
		if got != tt.want || ok != (tt.want != "") {
			t.Errorf("ParseTraceparent(%q) = %q, %v; want %q", tt.in, got, ok, tt.want)
		}
	}
}

func TestHandler(t *testing.T) {
	var buf bytes.Buffer
	log := slog.New(NewHandler(slog.NewTextHandler(&buf, &slog.HandlerOptions{
		ReplaceAttr: func(_ []string, a slog.Attr) slog.Attr {
			if a.Key == slog.TimeKey {
				return slog.Attr{}
			}
			return a
		}}))).With("component", "http")
	ctx := context.Background()
	log.ErrorContext(ctx, "no trace")
	log.ErrorContext(WithTraceID(ctx, "abc"), "traced", "rule", "api")
	// An OpenTelemetry span's ids win over the header's.
	sc := trace.NewSpanContext(trace.SpanContextConfig{TraceID: trace.TraceID{0x4b, 0xf9, 15: 0x36}, SpanID: trace.SpanID{0xf0, 7: 0xb7}})
	log.ErrorContext(trace.ContextWithSpanContext(WithTraceID(ctx, "abc"), sc), "span")
	want := "level=ERROR msg=\"no trace\" component=http\nlevel=ERROR msg=traced component=http rule=api trace_id=abc\n" +
		"level=ERROR msg=span component=http trace_id=4bf90000000000000000000000000036 span_id=f0000000000000b7\n"
	if buf.String() != want {
		t.Errorf("logged:\n%s\nwant:\n%s", buf.String(), want)
	}
}
