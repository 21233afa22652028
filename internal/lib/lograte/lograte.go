// Package lograte keeps a flood of one kind of log line down to one line
// an interval, with a count of the lines held back, so that a client
// retrying wrong passwords or a dead Redis cannot fill a disk.
package lograte

import (
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
