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

// Exact is an exact limiter on a fixed clock: the reference that fault
// and load tests compare what a store admitted with. Feed it the
// requests' arrival times in order; it admits what the memory store
// admits on those arrivals.
type Exact struct {
	clock *Clock
	store *floodgate.MemoryStore
	lim   *floodgate.Limiter
}

// NewExact returns an Exact for limits, starting at start.
func NewExact(start time.Time, limits ...floodgate.Limit) (*Exact, error) {
	e := &Exact{clock: NewClock(start)}
	e.store = floodgate.NewMemoryStore(&floodgate.MemoryOptions{Clock: e.clock, SweepInterval: -1})
	var err error
	if e.lim, err = floodgate.NewLimiter(e.store, limits, nil); err != nil {
		e.store.Close()
		return nil, err
	}
	return e, nil
}

// Allow reports whether a request of cost 1 on key arriving at at, after
// every earlier one, is admitted.
func (e *Exact) Allow(key string, at time.Time) bool {
	e.clock.Set(at)
	r, err := e.lim.Allow(context.Background(), key)
	return err == nil && r.Allowed
}

// Close releases the Exact's store.
func (e *Exact) Close() error { return e.store.Close() }
