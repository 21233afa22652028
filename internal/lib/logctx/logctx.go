// Package logctx carries a request's trace id from where it came in (a
// W3C traceparent header) to the log lines written while serving it, as a
// trace_id attribute, so that a line can be matched to the caller's trace.
// When the request is traced (an OpenTelemetry span in its context), the
// span's trace id is the one logged, with its span_id: the caller's trace
// id when it sent one, else the one floodgate's own trace started with.
package logctx

import (
	"context"
	"log/slog"

	"go.opentelemetry.io/otel/trace"
)

type traceKey struct{}

// WithTraceID returns ctx carrying the trace id, 32 lowercase hex digits.
func WithTraceID(ctx context.Context, id string) context.Context {
	return context.WithValue(ctx, traceKey{}, id)
}

// TraceID returns the trace id ctx carries, or "".
func TraceID(ctx context.Context) string {
	id, _ := ctx.Value(traceKey{}).(string)
	return id
}

// ParseTraceparent returns the trace id of a W3C traceparent header value
// ("00-<trace id>-<parent id>-<flags>"), and false for a malformed one,
// which the Trace Context spec says to ignore. Only the fields' form is
// checked: nothing is traced, the id is only logged.
func ParseTraceparent(h string) (string, bool) {
	// version(2) - trace id(32) - parent id(16) - flags(2); a version
	// after 00 may add fields after another dash.
	if len(h) < 55 || h[2] != '-' || h[35] != '-' || h[52] != '-' {
		return "", false
	}
	version, trace, parent, flags := h[:2], h[3:35], h[36:52], h[53:55]
	if !hex(version) || version == "ff" || (version == "00" && len(h) != 55) || (len(h) > 55 && h[55] != '-') {
		return "", false
	}
	if !hex(trace) || !hex(parent) || !hex(flags) || zeros(trace) || zeros(parent) {
		return "", false
	}
	return trace, true
}

// hex reports whether s is lowercase hex digits, as the spec requires.
func hex(s string) bool {
	for i := 0; i < len(s); i++ {
		if c := s[i]; !('0' <= c && c <= '9' || 'a' <= c && c <= 'f') {
			return false
		}
	}
	return true
}

func zeros(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] != '0' {
			return false
		}
	}
	return true
}

// NewHandler returns a handler that adds trace_id to the records logged
// with a context carrying one (Logger.ErrorContext and the like), and
// passes them to h.
func NewHandler(h slog.Handler) slog.Handler { return handler{h} }

type handler struct{ h slog.Handler }

func (h handler) Enabled(ctx context.Context, level slog.Level) bool {
	return h.h.Enabled(ctx, level)
}

func (h handler) Handle(ctx context.Context, r slog.Record) error {
	if sc := trace.SpanContextFromContext(ctx); sc.IsValid() {
		r = r.Clone()
		r.AddAttrs(slog.String("trace_id", sc.TraceID().String()), slog.String("span_id", sc.SpanID().String()))
	} else if id := TraceID(ctx); id != "" {
		r = r.Clone()
		r.AddAttrs(slog.String("trace_id", id))
	}
	return h.h.Handle(ctx, r)
}

func (h handler) WithAttrs(attrs []slog.Attr) slog.Handler { return handler{h.h.WithAttrs(attrs)} }
func (h handler) WithGroup(name string) slog.Handler       { return handler{h.h.WithGroup(name)} }
