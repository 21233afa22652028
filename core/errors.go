package core

import "errors"

// The sentinel errors of the store contract. Package floodgate re-exports
// them under the same names (and adds the Limiter's own, such as
// ErrCostTooHigh), so errors.Is(err, floodgate.ErrInvalidKey) and
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

// The bounds on a request.
const (
	// MaxKeyLen is the longest key, in bytes.
	MaxKeyLen = 1024
	// MaxLimits is the most limits that one key can be checked against at
	// once.
	MaxLimits = 8
)

// NeverMicros is Verdict.Retry for a request that can never be allowed.
const NeverMicros = -1
