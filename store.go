package floodgate

import (
	"context"
	"fmt"
	"time"
)

// Store keeps rate limit state and decides requests atomically. floodgate
// ships two: the in-memory store (NewMemoryStore), and the Redis store in
// package redisstore, which shares one limit between many processes. Both
// pass the conformance suite in package storetest, which any other Store
// should pass too.
//
// A Store is safe for concurrent use. Its methods return an error only
// when the input is invalid (wrapping ErrInvalidKey, ErrInvalidCost,
// ErrInvalidLimit or ErrNoLimits) or the store failed (wrapping ErrStore
// or ErrClosed); a denied request is a Result, not an error.
type Store interface {
	// Take decides whether a request of cost n passes every limit on key,
	// and charges all of them if it does; if any limit denies, none is
	// charged. It is atomic: concurrent Takes on a key behave as if run
	// one after the other. n = 0 peeks: it reports the state and changes
	// nothing.
	Take(ctx context.Context, key string, limits []Limit, n int64) (Result, error)
	// Reset forgets the state of key for limits, so that it is full again.
	Reset(ctx context.Context, key string, limits []Limit) error
	// Close releases the store's resources. It is safe to call more than
	// once; calls after the first return nil and do nothing.
	Close() error
}

// The bounds on a request.
const (
	// MaxKeyLen is the longest key, in bytes.
	MaxKeyLen = 1024
	// MaxLimits is the most limits that one key can be checked against at
	// once.
	MaxLimits = 8
)

// CheckTake returns the error that Take must return for this input, or nil
// when it is valid. Store implementations call it first.
func CheckTake(key string, limits []Limit, n int64) error {
	if err := CheckKey(key, limits); err != nil {
		return err
	}
	if n < 0 {
		return fmt.Errorf("%w: cost must not be negative, got %d", ErrInvalidCost, n)
	}
	return nil
}

// CheckKey returns the error that Reset must return for this input, or nil
// when it is valid.
func CheckKey(key string, limits []Limit) error {
	switch {
	case key == "":
		return fmt.Errorf("%w: empty key", ErrInvalidKey)
	case len(key) > MaxKeyLen:
		return fmt.Errorf("%w: key is %d bytes, more than the maximum %d", ErrInvalidKey, len(key), MaxKeyLen)
	case len(limits) == 0:
		return fmt.Errorf("%w: no limits given", ErrNoLimits)
	case len(limits) > MaxLimits:
		return fmt.Errorf("%w: %d limits given, at most %d are allowed", ErrNoLimits, len(limits), MaxLimits)
	}
	for i := range limits {
		if err := limits[i].validate(); err != nil {
			if len(limits) > 1 {
				return fmt.Errorf("limit %d: %w", i, err)
			}
			return err
		}
	}
	return nil
}

// Verdict is one limit's part of a decision, as a Store reports it to
// Combine. Remaining, RetryAfter and ResetAfter mean what they mean in
// Result; a request that passes this limit has RetryAfter 0.
type Verdict struct {
	Allowed    bool
	Remaining  int64
	RetryAfter time.Duration
	ResetAfter time.Duration
}

// Combine returns the Result of a request checked against limits, given
// each limit's verdict (verdicts[i] for limits[i]). The request is allowed
// when every verdict allows it. The Result describes, when denied, the
// denying limit with the longest RetryAfter; when allowed, the limit with
// the fewest units remaining; ties go to the first such limit. Stores other
// than the memory store use it so that all stores report alike.
func Combine(limits []Limit, verdicts []Verdict) Result {
	best, allowed := 0, true
	for i := range verdicts {
		if !verdicts[i].Allowed {
			allowed = false
		}
	}
	for i := 1; i < len(verdicts); i++ {
		v, b := &verdicts[i], &verdicts[best]
		if allowed {
			if v.Remaining < b.Remaining {
				best = i
			}
		} else if !v.Allowed && (b.Allowed || v.RetryAfter > b.RetryAfter) {
			best = i
		}
	}
	v := verdicts[best]
	return Result{
		Allowed:    allowed,
		Limit:      limits[best].quota,
		Remaining:  v.Remaining,
		RetryAfter: v.RetryAfter,
		ResetAfter: v.ResetAfter,
		Index:      best,
	}
}

func (v verdict) export() Verdict {
	r := Verdict{Allowed: v.allowed, Remaining: v.remaining, ResetAfter: usToDuration(v.reset)}
	if !v.allowed {
		r.RetryAfter = usToDuration(v.retry)
	}
	return r
}
