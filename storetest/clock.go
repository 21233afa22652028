package storetest

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/floodgate/floodgate"
)

// Clock is a floodgate.Clock that only moves when told to. Sleep advances
// it instead of sleeping, so code that waits runs instantly in tests.
// It is safe for concurrent use.
type Clock struct {
	mu sync.Mutex
	t  time.Time
}

// NewClock returns a Clock set to t.
func NewClock(t time.Time) *Clock { return &Clock{t: t} }

// Now returns the clock's time.
func (c *Clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

// Set sets the clock to t, which may be earlier than its time.
func (c *Clock) Set(t time.Time) {
	c.mu.Lock()
	c.t = t
	c.mu.Unlock()
}

// Advance moves the clock forward by d (backwards if d is negative).
func (c *Clock) Advance(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

// Sleep advances the clock by d and returns at once, or returns ctx.Err()
// without advancing if ctx is already done.
func (c *Clock) Sleep(ctx context.Context, d time.Duration) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	c.Advance(d)
	return nil
}

// NewLimiter returns a Limiter for limits on a new memory store, both on a
// Clock set to Base, for tests of code that uses a Limiter (middleware,
// clients). Wait advances the clock instead of sleeping. The store is
// closed when t ends.
func NewLimiter(t testing.TB, limits ...floodgate.Limit) (*floodgate.Limiter, *Clock) {
	t.Helper()
	clock := NewClock(Base)
	store := floodgate.NewMemoryStore(&floodgate.MemoryOptions{Clock: clock, SweepInterval: -1})
	t.Cleanup(func() { store.Close() })
	lim, err := floodgate.NewLimiter(store, limits, &floodgate.Options{Clock: clock})
	if err != nil {
		t.Fatal(err)
	}
	return lim, clock
}

// Limiter returns a Limiter for limits over store, with the defaults, and
// fails t if NewLimiter does.
func Limiter(t testing.TB, store floodgate.Store, limits ...floodgate.Limit) *floodgate.Limiter {
	t.Helper()
	lim, err := floodgate.NewLimiter(store, limits, nil)
	if err != nil {
		t.Fatal(err)
	}
	return lim
}
