package fallback

import (
	"context"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"
)

// EventFallback is the event that a decision answered by the mode rather
// than the primary adds to the span of its context, when that span is
// recording (a traced floodgate.Limiter's, see
// floodgate.Options.TracerProvider), with the mode (AttrMode) and whether
// the breaker was open (AttrDegraded), so that the primary was not even
// tried. The span's floodgate.source says which answer it got.
const EventFallback = "floodgate.fallback"

// The attributes of EventFallback.
const (
	AttrMode     = attribute.Key("floodgate.fallback.mode")     // Mode.String()
	AttrDegraded = attribute.Key("floodgate.fallback.degraded") // the breaker was open
)

// traceFallback adds EventFallback to ctx's span. It is called only when
// the mode answers, so that a decision of the primary spends nothing on
// it.
func traceFallback(ctx context.Context, mode Mode, degraded bool) {
	if span := trace.SpanFromContext(ctx); span.IsRecording() {
		span.AddEvent(EventFallback, trace.WithAttributes(AttrMode.String(mode.String()), AttrDegraded.Bool(degraded)))
	}
}
