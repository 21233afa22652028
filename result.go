package floodgate

import (
	"math"
	"strconv"
	"time"
)

// Never is the RetryAfter of a request that can never be allowed: its cost
// is larger than the quota of one of its limits. It is the largest
// Duration, so code that sleeps for RetryAfter does not spin.
const Never = time.Duration(math.MaxInt64)

// Result is the outcome of one decision on one key.
//
// When several limits apply to the key, Limit, Remaining, RetryAfter and
// ResetAfter describe the limit at Index: when the request was denied, the
// denying limit that keeps it out longest; when it was allowed, the limit
// with the fewest units remaining (the one closest to denying).
type Result struct {
	// Allowed reports whether the request passed and was charged. A peek
	// (cost 0) is always allowed and charges nothing.
	Allowed bool
	// Limit is the Quota of the limit at Index: the most it admits at once.
	Limit int64
	// Remaining is how many units of cost that limit would admit right now,
	// after this request. On a denial it is the current remaining, which
	// is less than the cost asked for.
	Remaining int64
	// RetryAfter is how long until the same request could be allowed,
	// rounded up to the microsecond: 0 when allowed, Never when the cost
	// is larger than the limit's Quota.
	RetryAfter time.Duration
	// ResetAfter is how long until the limit at Index is back to full
	// (Remaining == Limit) if no other request comes, rounded up to the
	// microsecond.
	ResetAfter time.Duration
	// Index is the position, in the limits the key was checked against,
	// of the limit that the figures above describe.
	Index int
	// Source says who decided: the store itself (the zero value), or,
	// when a fallback store (package fallback) could not reach its
	// primary store, the local limiter or the fail-open or fail-closed
	// policy.
	Source Source
}

// Source says which part of a store stack decided a Result.
type Source uint8

// The sources.
const (
	// SourceStore is the store that was called: the memory store, or
	// Redis. It is the zero value.
	SourceStore Source = iota
	// SourceLocal is a fallback's local in-memory limiter, which answered
	// because the primary store failed or its breaker was open.
	SourceLocal
	// SourceFailOpen is a fallback's fail-open policy: the primary store
	// failed and the request was allowed without a decision.
	SourceFailOpen
	// SourceFailClosed is a fallback's fail-closed policy: the primary
	// store failed and the request was denied without a decision.
	SourceFailClosed
	// SourceCache is the Redis store's local denial cache: Redis denied
	// the same request on the same key a moment ago, and nothing but time
	// can change that (see redisstore.Options.DenialCache).
	SourceCache
)

var sourceNames = [...]string{"store", "local", "fail-open", "fail-closed", "cache"}

// String returns "store", "local", "fail-open", "fail-closed" or "cache".
func (s Source) String() string {
	if int(s) < len(sourceNames) {
		return sourceNames[s]
	}
	return "Source(" + strconv.Itoa(int(s)) + ")"
}

// verdict is one algorithm's decision on one limit, in microseconds.
type verdict struct {
	allowed   bool
	remaining int64
	retry     int64 // microseconds; -1 for never; 0 when allowed
	reset     int64 // microseconds
}

const never = -1

func usToDuration(us int64) time.Duration {
	if us < 0 {
		return Never
	}
	if us > math.MaxInt64/int64(time.Microsecond) {
		return Never
	}
	return time.Duration(us) * time.Microsecond
}
