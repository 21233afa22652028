package floodgate

import (
	"context"
	"fmt"
	"slices"
)

// Limiter applies a fixed set of limits to keys, over a Store.
//
// A Limiter is safe for concurrent use. Its methods that talk to the store
// take a context first and return the store's errors; a denied request is
// reported by Result.Allowed, never as an error.
type Limiter struct {
	store  Store
	limits []Limit
	clock  Clock
	owned  bool // the Limiter made the store, so Close closes it
}

// Option configures a Limiter.
type Option func(*Limiter)

// WithClock makes Wait read the time and sleep through c instead of the
// system clock. Give the store the same clock in tests.
func WithClock(c Clock) Option {
	return func(l *Limiter) { l.clock = c }
}

// New returns a Limiter that applies limits over a new in-memory store
// with the default configuration, which Close closes. It returns an error
// wrapping ErrInvalidLimit or ErrNoLimits if the limits are not usable.
//
// Several limits are checked as one: New(PerSecond(10), PerHour(1000)).
func New(limits ...Limit) (*Limiter, error) {
	if err := checkLimits(limits); err != nil {
		return nil, err
	}
	l, err := NewLimiter(NewMemoryStore(nil), limits)
	if err != nil {
		return nil, err
	}
	l.owned = true
	return l, nil
}

// NewLimiter returns a Limiter that applies limits over store. Closing the
// Limiter does not close store, which may be shared by several Limiters.
func NewLimiter(store Store, limits []Limit, opts ...Option) (*Limiter, error) {
	if store == nil {
		return nil, fmt.Errorf("floodgate: NewLimiter needs a store")
	}
	if err := checkLimits(limits); err != nil {
		return nil, err
	}
	l := &Limiter{store: store, limits: slices.Clone(limits), clock: SystemClock()}
	for _, o := range opts {
		o(l)
	}
	return l, nil
}

func checkLimits(limits []Limit) error {
	// "k" stands in for a key: only the limits are checked here.
	return CheckKey("k", limits)
}

// Limits returns a copy of the limits the Limiter applies.
func (l *Limiter) Limits() []Limit { return slices.Clone(l.limits) }

// Allow is AllowN(ctx, key, 1).
func (l *Limiter) Allow(ctx context.Context, key string) (Result, error) {
	return l.store.Take(ctx, key, l.limits, 1)
}

// AllowN decides whether a request of cost n on key passes every limit,
// and charges them all if it does. n = 0 peeks: the Result reports the
// key's state and nothing changes. A cost larger than a limit's Quota is
// denied with RetryAfter Never.
func (l *Limiter) AllowN(ctx context.Context, key string, n int64) (Result, error) {
	return l.store.Take(ctx, key, l.limits, n)
}

// Peek is AllowN(ctx, key, 0): the key's state, without changing it.
func (l *Limiter) Peek(ctx context.Context, key string) (Result, error) {
	return l.store.Take(ctx, key, l.limits, 0)
}

// Reset makes key full again on every limit.
func (l *Limiter) Reset(ctx context.Context, key string) error {
	return l.store.Reset(ctx, key, l.limits)
}

// Wait blocks until a request of cost n on key is allowed (and charged),
// or ctx is done. It returns at once, without waiting, an error wrapping
// ErrCostTooHigh when n is larger than a limit's Quota, and one wrapping
// ErrDeadline when ctx's deadline comes before the request could pass.
//
// Wait sleeps for the RetryAfter that each denial reports, then tries
// again. Waiters are not queued: when several wait on one key, the first
// to try after capacity returns gets it.
func (l *Limiter) Wait(ctx context.Context, key string, n int64) error {
	for {
		if err := ctx.Err(); err != nil {
			return err
		}
		r, err := l.store.Take(ctx, key, l.limits, n)
		if err != nil {
			return err
		}
		if r.Allowed {
			return nil
		}
		if r.RetryAfter == Never {
			return fmt.Errorf("%w: cost %d, limit %d is %s", ErrCostTooHigh, n, r.Index, l.limits[r.Index])
		}
		if dl, ok := ctx.Deadline(); ok && l.clock.Now().Add(r.RetryAfter).After(dl) {
			return fmt.Errorf("%w: allowed in %s", ErrDeadline, r.RetryAfter)
		}
		if err := l.clock.Sleep(ctx, r.RetryAfter); err != nil {
			return err
		}
	}
}

// Close closes the store if New made it, and does nothing otherwise. It is
// safe to call more than once.
func (l *Limiter) Close() error {
	if l.owned {
		return l.store.Close()
	}
	return nil
}
