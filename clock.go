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
// that reads the time; everything else is given a Clock.
//
// The clock reads the time of day once, when SystemClock is called, and
// from then on adds the monotonic clock's progress to it. A step of the
// system's wall clock (NTP, an administrator) therefore does not move it:
// a rate limiter must neither free nor block requests because the date
// changed. Over a long run it may differ from the time of day by the
// corrections the wall clock received since. Reading it is also cheaper
// than time.Now, which reads both clocks.
func SystemClock() Clock {
	start := time.Now()
	return &systemClock{start: start, startMicro: start.UnixMicro()}
}

type systemClock struct {
	start      time.Time // with its monotonic reading
	startMicro int64     // start in Unix microseconds
}

func (c *systemClock) Now() time.Time { return c.start.Add(time.Since(c.start)) }

// micros is c.Now().UnixMicro() without building a time.Time: the one read
// of the clock on the memory store's hot path.
func (c *systemClock) micros() int64 {
	return c.startMicro + int64(time.Since(c.start)/time.Microsecond)
}

func (*systemClock) Sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
