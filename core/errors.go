package core

import (
	"errors"
	"fmt"

	"github.com/floodgate/floodgate/internal/lib/arith"
)

// The sentinel errors. Package floodgate re-exports them under the same
// names, so errors.Is(err, floodgate.ErrInvalidKey) and
// errors.Is(err, core.ErrInvalidKey) are the same test. Functions wrap them
// with %w and a message that says what was wrong.
var (
	// ErrInvalidLimit reports a limit whose parameters are out of range
	// (zero, negative or too large), or the zero Limit.
	ErrInvalidLimit = errors.New("floodgate: invalid limit")
	// ErrInvalidKey reports an empty key or one longer than MaxKeyLen bytes.
	ErrInvalidKey = errors.New("floodgate: invalid key")
	// ErrInvalidCost reports a negative cost.
	ErrInvalidCost = errors.New("floodgate: invalid cost")
	// ErrNoLimits reports a set of no limits, or of more than MaxLimits.
	ErrNoLimits = errors.New("floodgate: wrong number of limits")
	// ErrCostTooHigh is returned by Limiter.Wait for a cost that no limit
	// can ever admit (it is larger than a limit's Quota). A decision
	// reports the same situation as a denial with RetryAfter Never.
	ErrCostTooHigh = errors.New("floodgate: cost exceeds the limit's quota and can never be allowed")
	// ErrDeadline is returned by Limiter.Wait when the context's deadline
	// comes before the request could be allowed; Wait returns it at once
	// rather than waiting in vain.
	ErrDeadline = errors.New("floodgate: request would not be allowed before the context deadline")
	// ErrClosed reports a call on a store after Close.
	ErrClosed = errors.New("floodgate: store closed")
	// ErrStore reports that a store failed (a network error, a Redis error,
	// a key holding data that is not floodgate's). Stores wrap it together
	// with the underlying error.
	ErrStore = errors.New("floodgate: store failed")
	// ErrKey reports that a store could not decide one key while it works
	// for the others: the key holds data that is not floodgate's (another
	// type, corrupt state, an invalid override), or the server refused a
	// command on it (an ACL's NOPERM). errors.Is(err, ErrStore) holds for
	// it too, so code that treats every store error alike keeps doing so;
	// code that judges the store's health (fallback's breaker) must test
	// ErrKey first: it is that key's failure, not the store's.
	ErrKey error = keyError{}
)

// keyError is ErrKey's type: one value, which is also ErrStore to
// errors.Is, since the store did fail to decide that key.
type keyError struct{}

func (keyError) Error() string { return "floodgate: key failed" }

// Is makes errors.Is(ErrKey, ErrStore) true.
func (keyError) Is(target error) bool { return target == ErrStore }

// IsInvalidInput reports whether err says that the request, not the
// store, was wrong: an invalid key, cost, limit or permit, or a wrong number of
// limits. Such an error is the caller's to fix; retrying, or answering
// from a fallback, would not help.
func IsInvalidInput(err error) bool {
	return errors.Is(err, ErrInvalidKey) || errors.Is(err, ErrInvalidCost) ||
		errors.Is(err, ErrInvalidLimit) || errors.Is(err, ErrNoLimits) ||
		errors.Is(err, ErrInvalidPermit)
}

// The bounds on a request.
const (
	// MaxKeyLen is the longest key, in bytes.
	MaxKeyLen = 1024
	// MaxLimits is the most limits that one key can be checked against at
	// once.
	MaxLimits = 8
)

// CheckKey returns nil for a usable key, or an error wrapping
// ErrInvalidKey: the key is empty or longer than MaxKeyLen bytes. Any
// bytes are allowed.
func CheckKey(key string) error {
	switch {
	case key == "":
		return fmt.Errorf("%w: empty key", ErrInvalidKey)
	case len(key) > MaxKeyLen:
		return fmt.Errorf("%w: key is %d bytes, more than the maximum %d", ErrInvalidKey, len(key), MaxKeyLen)
	}
	return nil
}

// CheckCost returns nil for a cost of 0 or more, or an error wrapping
// ErrInvalidCost.
func CheckCost(n int64) error {
	if n < 0 {
		return fmt.Errorf("%w: cost must not be negative, got %d", ErrInvalidCost, n)
	}
	return nil
}

// CheckRequest returns nil for a request that a Policy's Take can
// decide: CheckKey's error for its key, else CheckCost's for its cost.
func CheckRequest(key string, n int64) error {
	if err := CheckKey(key); err != nil {
		return err
	}
	return CheckCost(n)
}

// CheckSpecs returns nil when specs can be prepared: 1 to MaxLimits specs,
// each valid (see Spec.Validate), whose sliding logs admit at most
// MaxLogQuota units together. Every Store's Prepare calls it first.
func CheckSpecs(specs []Spec) error {
	switch {
	case len(specs) == 0:
		return fmt.Errorf("%w: no limits given", ErrNoLimits)
	case len(specs) > MaxLimits:
		return fmt.Errorf("%w: %d limits given, at most %d are allowed", ErrNoLimits, len(specs), MaxLimits)
	}
	for i := range specs {
		if err := specs[i].Validate(); err != nil {
			if len(specs) > 1 {
				return fmt.Errorf("limit %d: %w", i, err)
			}
			return err
		}
	}
	return checkLogQuotas(specs)
}

// checkLogQuotas returns nil when the sliding logs among specs admit at
// most MaxLogQuota units together, and otherwise an error wrapping
// ErrInvalidLimit: one request checks every limit of a set, so the
// bound on one request's work is on their sum.
func checkLogQuotas(specs []Spec) error {
	var sum int64
	for i := range specs {
		if specs[i].Kind == Log {
			sum += specs[i].Quota
		}
	}
	if sum > MaxLogQuota {
		return fmt.Errorf("%w: the sliding-log limits of one set add up to %d, more than the maximum %d: "+
			"a sliding log records every unit it admits; use sliding-window (the sliding window counter) for larger limits",
			ErrInvalidLimit, sum, MaxLogQuota)
	}
	return nil
}

// Never is the RetryAfter of a request that can never be allowed: its cost
// is larger than the quota of one of its limits. It is the largest
// Duration, so code that sleeps for it does not spin.
const Never = arith.Never

// NeverMicros is Verdict.Retry for a request that can never be allowed.
const NeverMicros = -1
