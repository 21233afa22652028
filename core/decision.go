package core

import "strconv"

// Decision is a store's answer to one request against one or several
// limits: the Verdict of the limit that describes it, which limit that is,
// and who decided. package floodgate's Limiter turns it into a Result.
type Decision struct {
	// Verdict is the verdict of the limit at Index. Its Allowed is the
	// request's: a request passes only if every limit admits it.
	Verdict
	// Index is the position of that limit among the Policy's limits.
	Index int
	// Source says who decided.
	Source Source
	// Limits is nil, or, when the key has an override (see Policy.SetOverride),
	// the override's limits, which Index refers to instead of the
	// Policy's.
	Limits []Spec
}

// Decide combines the verdicts of a request's limits (vs[i] for limit i)
// into a Decision. The request is allowed when every verdict allows it.
// The verdict that describes it is, when denied, the denying one with the
// longest Retry; when allowed, the one with the fewest units remaining
// (the limit closest to denying); ties go to the first. Every store
// decides with it, so that all report alike.
func Decide(vs []Verdict) Decision {
	best, allowed := 0, true
	for i := range vs {
		if !vs[i].Allowed {
			allowed = false
		}
	}
	for i := 1; i < len(vs); i++ {
		v, b := &vs[i], &vs[best]
		if allowed {
			if v.Remaining < b.Remaining {
				best = i
			}
		} else if !v.Allowed && (b.Allowed || uint64(v.Retry) > uint64(b.Retry)) {
			// As unsigned numbers, NeverMicros (-1) is the longest retry.
			best = i
		}
	}
	return Decision{Verdict: vs[best], Index: best}
}

// Source says which part of a store stack decided a request. Package
// floodgate calls it floodgate.Source, in a Result.
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
	// can change that.
	SourceCache
	// SourceLease is the Redis store's lease on a hot key: units this
	// process took from Redis beforehand, admitted locally.
	SourceLease
)

var sourceNames = [...]string{"store", "local", "fail-open", "fail-closed", "cache", "lease"}

// String returns "store", "local", "fail-open", "fail-closed", "cache" or
// "lease".
func (s Source) String() string {
	if int(s) < len(sourceNames) {
		return sourceNames[s]
	}
	return "Source(" + strconv.Itoa(int(s)) + ")"
}
