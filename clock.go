package floodgate

import (
	"context"
	"time"
)

// Clock is a source of time. Stores read it for every decision and
// Limiter.Wait uses it to sleep, so that tests can run against a clock they
// control (see storetest.Clock) and never sleep for real.
type Clock interface {
	// Now returns the current time.
	Now() time.Time
	// Sleep pauses for d or until ctx is done, whichever comes first, and
	// returns ctx.Err() in the second case.
	Sleep(ctx context.Context, d time.Duration) error
}

// SystemClock returns the real clock. It is the only place in floodgate
// that reads the time of day; everything else is given a Clock.
func SystemClock() Clock { return systemClock{} }

type systemClock struct{}

func (systemClock) Now() time.Time { return time.Now() }

func (systemClock) Sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// unixMicro converts t to integer microseconds since the Unix epoch, the
// unit every algorithm works in.
func unixMicro(t time.Time) int64 { return t.UnixMicro() }
