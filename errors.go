package floodgate

import "errors"

// The sentinel errors. Functions wrap them with %w and a message that says
// what was wrong, so test them with errors.Is. A denied request is never an
// error: it is a Result with Allowed false.
var (
	// ErrInvalidLimit reports a Limit whose parameters are out of range
	// (zero, negative or too large), or the zero Limit.
	ErrInvalidLimit = errors.New("floodgate: invalid limit")
	// ErrInvalidKey reports an empty key or one longer than MaxKeyLen bytes.
	ErrInvalidKey = errors.New("floodgate: invalid key")
	// ErrInvalidCost reports a negative cost.
	ErrInvalidCost = errors.New("floodgate: invalid cost")
	// ErrNoLimits reports a call with no limits, or more than MaxLimits.
	ErrNoLimits = errors.New("floodgate: wrong number of limits")
	// ErrCostTooHigh is returned by Limiter.Wait for a cost that no limit
	// can ever admit (it is larger than a limit's Quota). AllowN reports
	// the same situation as a denial with RetryAfter Never.
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
)
