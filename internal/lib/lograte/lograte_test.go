package lograte

import (
	"bytes"
	"context"
	"log/slog"
	"testing"
	"time"
)

// TestAllow: on a fixed clock, one event an interval gets through, with
// the number held back since the last.
func TestAllow(t *testing.T) {
	now := time.Unix(1000, 0)
	l := New(time.Second, func() time.Time { return now })
	steps := []struct {
		advance time.Duration
		events  int
		held    int64 // of the last event let through
		lines   int
	}{
		{0, 1, 0, 1},                      // the first event at once
		{100 * time.Millisecond, 5, 0, 0}, // within the interval: held
		{900 * time.Millisecond, 1, 5, 1}, // a second after the first: with the 5 held
		{999 * time.Millisecond, 3, 0, 0}, // not quite a second
		{time.Millisecond, 2, 3, 1},       // the first of these two lets through the 3
		{10 * time.Second, 1, 1, 1},       // long after: the one held before
		{time.Second, 0, 0, 0},            // no events, no lines
		{time.Second, 1, 0, 1},            // nothing held
	}
	for i, st := range steps {
		now = now.Add(st.advance)
		lines := 0
		var held int64
		for range st.events {
			if h, ok := l.Allow(); ok {
				lines++
				held = h
			}
		}
		if lines != st.lines || held != st.held {
			t.Errorf("step %d: %d lines, held %d; want %d lines, held %d", i, lines, held, st.lines, st.held)
		}
	}
}

// TestLogAndHandler: Log and NewHandler let one line an interval through,
// the next one counting those held back, and a level filtered out spends
// no line.
func TestLogAndHandler(t *testing.T) {
	for _, via := range []string{"Log", "Handler"} {
		t.Run(via, func(t *testing.T) {
			now := time.Unix(1000, 0)
			clock := func() time.Time { return now }
			var buf bytes.Buffer
			base := slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{
				Level:       slog.LevelInfo,
				ReplaceAttr: func(_ []string, a slog.Attr) slog.Attr { return dropTime(a) },
			}))
			var emit func(slog.Level)
			switch via {
			case "Log":
				l := New(time.Second, clock)
				emit = func(level slog.Level) { l.Log(context.Background(), base, level, "store failed", "rule", "r") }
			case "Handler":
				log := slog.New(NewHandler(base.Handler(), time.Second, clock)).With("rule", "r")
				emit = func(level slog.Level) { log.Log(context.Background(), level, "store failed") }
			}
			steps := []struct {
				advance time.Duration
				level   slog.Level
				n       int
				want    string
			}{
				{0, slog.LevelError, 3, "level=ERROR msg=\"store failed\" rule=r\n"},
				{time.Second, slog.LevelDebug, 5, ""}, // filtered out: no line, none counted
				{0, slog.LevelWarn, 1, "level=WARN msg=\"store failed\" rule=r suppressed=2\n"},
				{time.Second, slog.LevelWarn, 1, "level=WARN msg=\"store failed\" rule=r\n"},
			}
			for i, st := range steps {
				now = now.Add(st.advance)
				buf.Reset()
				for range st.n {
					emit(st.level)
				}
				if got := buf.String(); got != st.want {
					t.Errorf("step %d: logged %q, want %q", i, got, st.want)
				}
			}
		})
	}
}

func dropTime(a slog.Attr) slog.Attr {
	if a.Key == slog.TimeKey {
		return slog.Attr{}
	}
	return a
}
