package floodgate

import (
	"errors"

	"github.com/floodgate/floodgate/core"
	"github.com/floodgate/floodgate/internal/lib/storekit"
)

// The sentinel errors. Functions wrap them with %w and a message that says
// what was wrong, so test them with errors.Is. A denied request is never an
// error: it is a Result with Allowed false.
var (
	// ErrInvalidLimit reports a Limit whose parameters are out of range
	// (zero, negative or too large), or the zero Limit.
	ErrInvalidLimit = core.ErrInvalidLimit
	// ErrInvalidKey reports an empty key or one longer than MaxKeyLen bytes.
	ErrInvalidKey = core.ErrInvalidKey
	// ErrInvalidCost reports a negative cost.
	ErrInvalidCost = core.ErrInvalidCost
	// ErrNoLimits reports a Limiter of no limits, or of more than MaxLimits.
	ErrNoLimits = core.ErrNoLimits
	// ErrCostTooHigh is returned by Limiter.WaitN for a cost that no limit
	// can ever admit (it is larger than a limit's Quota). AllowN reports
	// the same situation as a denial with RetryAfter Never.
	ErrCostTooHigh = errors.New("floodgate: cost exceeds the limit's quota and can never be allowed")
	// ErrDeadline is returned by Limiter.WaitN when the context's deadline
	// comes before the request could be allowed; WaitN returns it at once
	// rather than waiting in vain.
	ErrDeadline = errors.New("floodgate: request would not be allowed before the context deadline")
	// ErrClosed reports a call on a store after Close.
	ErrClosed = core.ErrClosed
	// ErrStore reports that a store failed (a network error, a Redis error,
	// a key holding data that is not floodgate's). Stores wrap it together
	// with the underlying error.
	ErrStore = core.ErrStore
	// ErrKey reports that a store could not decide one key while it works
	// for the others: the key holds data that is not floodgate's (another
	// type, corrupt state, an invalid override), or the server refused a
	// command on it (an ACL's NOPERM). Such an error also wraps ErrStore;
	// test ErrKey first where the difference matters. The fallback store
	// returns it to the caller as it is: it neither counts it against
	// Redis nor answers that key locally.
	ErrKey = core.ErrKey
)

// IsInvalidInput reports whether err says that the request, not the
// store, was wrong: an invalid key, cost or limit, a wrong number of
// limits, or a permit id that is not one of the key's. Such an error is the caller's to fix (an HTTP 400, a gRPC
// InvalidArgument); retrying, or answering from a fallback, would not help.
func IsInvalidInput(err error) bool { return storekit.IsInvalidInput(err) }
