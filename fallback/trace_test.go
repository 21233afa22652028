package fallback_test

import (
	"context"
	"testing"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/floodgate/floodgate"
	"github.com/floodgate/floodgate/fallback"
)

// TestTraceFallback: a traced decision that the mode answers carries the
// fallback event, with the mode, in its check span, whose source says
// who answered; one that the primary answers has none.
func TestTraceFallback(t *testing.T) {
	for _, mode := range []fallback.Mode{fallback.Local, fallback.FailOpen, fallback.FailClosed} {
		t.Run(mode.String(), func(t *testing.T) {
			f := newFixture(t, fallback.Options{Mode: mode, Threshold: 1000})
			rec := tracetest.NewSpanRecorder()
			tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
			defer tp.Shutdown(context.Background())
			lim, err := floodgate.NewLimiter(f.store, []floodgate.Limit{floodgate.TokenBucket(10, time.Second, 8)}, &floodgate.Options{TracerProvider: tp})
			if err != nil {
				t.Fatal(err)
			}
			for _, down := range []bool{false, true} {
				if down {
					f.primary.mode.Store(int32(failing))
				}
				r, err := lim.Allow(context.Background(), "k")
				if err != nil {
					t.Fatal(err)
				}
				spans := rec.Ended()
				s := spans[len(spans)-1]
				var events []string
				for _, e := range s.Events() {
					events = append(events, e.Name)
					for _, a := range e.Attributes {
						if a.Key == fallback.AttrMode && a.Value.AsString() != mode.String() {
							t.Errorf("mode %v, want %v", a.Value.AsString(), mode)
						}
					}
				}
				var source string
				for _, a := range s.Attributes() {
					if a.Key == floodgate.AttrSource {
						source = a.Value.AsString()
					}
				}
				if source != r.Source.String() {
					t.Errorf("down %v: span's source %q, the result's %v", down, source, r.Source)
				}
				if want := down; (len(events) == 1 && events[0] == fallback.EventFallback) != want || len(events) > 1 {
					t.Errorf("down %v: events %v", down, events)
				}
			}
		})
	}
}
