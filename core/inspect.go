package core

import "context"

// Inspector is implemented by a Policy that can report a key's state
// under each of its limits, not only under the one a Decision describes,
// and which parts of the store would answer for it. It is optional:
// floodgate.Limiter.Inspect returns an error wrapping
// errors.ErrUnsupported for a Policy without it. The memory store, the
// Redis store and the fallback store implement it. It exists so that an
// operator can be told why a key is limited (floodgate serve's explain
// API); it is not for the decision path.
type Inspector interface {
	// Inspect reports key's state as a Take of cost 0 sees it, one Verdict
	// per limit, and charges nothing, on the store or in any cache or
	// lease. Its errors are Take's.
	Inspect(ctx context.Context, key string) (Inspection, error)
}

// Inspection is what Inspector.Inspect reports of a key.
type Inspection struct {
	// Decision is the peek's: as Take(ctx, key, 0) returns it, with the
	// Source that answered the peek.
	Decision
	// Verdicts holds every limit's verdict of the peek, in order: those
	// of Decision.Limits when the key has an override, else the Policy's.
	// A peek's verdicts are allowed, with a Retry of 0.
	Verdicts []Verdict
	// Lease is how many units of a lease this process holds on the key
	// (the Redis store's Options.Leases): taken from the store already,
	// not in its Remaining, and admitted here without asking the store.
	// 0 without one.
	Lease int64
	// DenialCached reports that this process holds a cached denial of the
	// key (the Redis store's denial cache): a request like the one denied
	// is answered from it, without asking the store, until its retry.
	DenialCached bool
	// Fallback is set by a store that answers through a failure mode when
	// its primary fails (package fallback); nil otherwise.
	Fallback *FallbackInspection
}

// FallbackInspection is what a fallback store reports of a key.
type FallbackInspection struct {
	// Mode is the fallback's failure mode: "local", "fail-open" or
	// "fail-closed".
	Mode string
	// Degraded reports that the key's primary is failing: its breaker is
	// open, or the primary failed to answer this inspection. The mode
	// answers the key's requests then, not the primary.
	Degraded bool
	// Instances is how many processes share the limits: the local
	// limiter applies 1/Instances of each limit (Spec.Share).
	Instances int64
	// Local holds the local limiter's verdicts of the key, one per limit
	// of its shares, when the mode is local; nil otherwise. While the
	// primary answers, the fallback keeps them at the key's share of
	// what the primary has left.
	Local []Verdict
}
