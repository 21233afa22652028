package floodgate

import (
	"time"

	"github.com/floodgate/floodgate/core"
	"github.com/floodgate/floodgate/internal/lib/arith"
)

// Never is the RetryAfter of a request that can never be allowed: its cost
// is larger than the quota of one of its limits. It is the largest
// Duration, so code that sleeps for RetryAfter does not spin.
const Never = arith.Never

// Result is the outcome of one decision on one key.
//
// When several limits apply to the key, Quota, Remaining, RetryAfter and
// ResetAfter describe one of them, the one at Index and called Name: when
// the request was denied, the denying limit that keeps it out longest;
// when it was allowed, the limit with the fewest units remaining (the one
// closest to denying).
type Result struct {
	// Allowed reports whether the request passed and was charged. A peek
	// (cost 0) is always allowed and charges nothing.
	Allowed bool
	// Overridden reports that the key has an override (see
	// Limiter.SetOverride): Index and Name then refer to the override's
	// limits, not to the Limiter's.
	Overridden bool
	// Source says who decided: the store itself (the zero value), or,
	// when a fallback store (package fallback) could not reach its
	// primary store, the local limiter or the fail-open or fail-closed
	// policy, or the Redis store's denial cache or a lease it holds.
	Source Source
	// Quota is the Quota of the limit described: the most it admits at
	// once.
	Quota int64
	// Remaining is how many units of cost that limit would admit right now,
	// after this request. On a denial it is the current remaining, which
	// is less than the cost asked for.
	Remaining int64
	// RetryAfter is how long until the same request could be allowed,
	// rounded up to the microsecond: 0 when allowed, Never when the cost
	// is larger than the limit's Quota.
	RetryAfter time.Duration
	// ResetAfter is how long until the limit is back to full
	// (Remaining == Quota) if no other request comes, rounded up to the
	// microsecond.
	ResetAfter time.Duration
	// Index is the position of the limit described among the Limiter's
	// limits.
	Index int
	// Name is that limit's Name, "" when it has none.
	Name string
}

// Source says which part of a store stack decided a Result: the store
// itself (SourceStore, the zero value), a fallback's local limiter or
// failure mode, or the Redis store's denial cache or lease. It is
// core.Source, so that a store's Decision and a Result say it alike.
type Source = core.Source

// The sources; see core.Source for each one's meaning. String returns
// "store", "local", "fail-open", "fail-closed", "cache" or "lease".
const (
	SourceStore      = core.SourceStore
	SourceLocal      = core.SourceLocal
	SourceFailOpen   = core.SourceFailOpen
	SourceFailClosed = core.SourceFailClosed
	SourceCache      = core.SourceCache
	SourceLease      = core.SourceLease
)

// result turns a decision against specs into a Result.
func result(specs []core.Spec, d *core.Decision) (r Result) {
	if d.Limits != nil {
		fillVerdict(&r, &d.Limits[d.Index], &d.Verdict, d.Index)
		r.Overridden = true
	} else {
		fillVerdict(&r, &specs[d.Index], &d.Verdict, d.Index)
	}
	r.Source = d.Source
	return r
}

// fillVerdict fills r, a zero Result, with the verdict of the limit sp, at
// index i: the memory store's hot path, without a Decision. It fills r in
// place, so that Limiter.AllowN writes its own result once rather than
// building a Result and copying it: a copy is a visible part of a
// decision this short (bench's BenchmarkMemoryVsXTimeRate guards it).
func fillVerdict(r *Result, sp *core.Spec, v *core.Verdict, i int) {
	r.Allowed, r.Quota, r.Remaining, r.Index, r.Name = v.Allowed, sp.Quota, v.Remaining, i, sp.Name
	r.ResetAfter = time.Duration(max(v.Reset, 0)) * time.Microsecond // below 2^53 µs: no overflow
	if !v.Allowed {
		r.RetryAfter = arith.Duration(v.Retry)
	}
}
