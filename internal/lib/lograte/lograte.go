// Package lograte keeps a flood of one kind of log line down to one line
// an interval, with a count of the lines held back, so that a client
// retrying wrong passwords or a dead Redis cannot fill a disk.
package lograte

import (
	"context"
	"log/slog"
	"sync/atomic"
	"time"
)

// Limiter lets through at most one event an interval and counts the ones
// it holds back. It is safe for concurrent use. Make one with New.
type Limiter struct {
	every time.Duration
	now   func() time.Time
	last  atomic.Int64 // unix nanoseconds of the last event let through; 0: none yet
	held  atomic.Int64 // events since then
}

// New returns a Limiter that lets one event through every interval
// (default, for 0 or less: a second), timed by now (default time.Now).
func New(every time.Duration, now func() time.Time) *Limiter {
	if every <= 0 {
		every = time.Second
	}
	if now == nil {
		now = time.Now
	}
	return &Limiter{every: every, now: now}
}

// Allow counts an event and reports whether to log it: true for the first
// event, and then for the first event an interval after the last one let
// through. With true it returns how many events it held back since that
// one, for the line to say.
func (l *Limiter) Allow() (held int64, ok bool) {
	n := l.held.Add(1)
	now := l.now().UnixNano()
	last := l.last.Load()
	if last != 0 && now-last < int64(l.every) {
		return 0, false
	}
	if !l.last.CompareAndSwap(last, now) {
		return 0, false // another event took this interval's line
	}
	l.held.Add(-n)
	return n - 1, true
}

// Log logs msg at level through log when l allows it, with a "suppressed"
// attribute counting the calls held back since the last line, when there
// were any. A nil log logs nothing.
func (l *Limiter) Log(ctx context.Context, log *slog.Logger, level slog.Level, msg string, args ...any) {
	if log == nil || !log.Enabled(ctx, level) {
		return // a level filtered out spends no line of the interval
	}
	held, ok := l.Allow()
	if !ok {
		return
	}
	if held > 0 {
		args = append(args[:len(args):len(args)], "suppressed", held)
	}
	log.Log(ctx, level, msg, args...)
}

// NewHandler returns a handler that passes to h at most one record an
// interval (default, for 0 or less: a second), timed by now (default
// time.Now), adding "suppressed" with the records held back since the
// last. Handlers derived from it by WithAttrs and WithGroup share its
// interval. It suits a logger that a library logs each failure through,
// such as http.Server's ErrorLog on a flood of bad connections.
func NewHandler(h slog.Handler, every time.Duration, now func() time.Time) slog.Handler {
	return &handler{h: h, l: New(every, now)}
}

type handler struct {
	h slog.Handler
	l *Limiter
}

func (h *handler) Enabled(ctx context.Context, level slog.Level) bool {
	return h.h.Enabled(ctx, level)
}

func (h *handler) Handle(ctx context.Context, r slog.Record) error {
	held, ok := h.l.Allow()
	if !ok {
		return nil
	}
	if held > 0 {
		r = r.Clone()
		r.AddAttrs(slog.Int64("suppressed", held))
	}
	return h.h.Handle(ctx, r)
}

func (h *handler) WithAttrs(attrs []slog.Attr) slog.Handler {
	return &handler{h: h.h.WithAttrs(attrs), l: h.l}
}

func (h *handler) WithGroup(name string) slog.Handler {
	return &handler{h: h.h.WithGroup(name), l: h.l}
}
