package lograte

import (
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
