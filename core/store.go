package core

import "context"

// Store keeps rate limit state and decides requests atomically. floodgate
// ships the in-memory store (floodgate.NewMemoryStore), the Redis store
// (package redisstore) and a wrapper that survives the Redis store's
// failures (package fallback); package floodgate calls it floodgate.Store.
//
// floodgate.NewLimiter calls Prepare once, with its limits compiled to
// Specs, and decides every request through the Policy it returns, so that
// a Store does its set-up work (validation, encoding, sharing) once and a
// decision only decides. The package documentation says how to write one.
//
// A Store and its Policies are safe for concurrent use.
type Store interface {
	// Prepare validates limits and returns the Policy that decides
	// requests against all of them as one. It does no I/O. Its errors
	// wrap ErrNoLimits (no limits, or more than MaxLimits),
	// ErrInvalidLimit (a Spec whose Validate fails, or sliding logs whose
	// Quotas add up to more than MaxLogQuota) or ErrClosed.
	Prepare(limits []Spec) (Policy, error)
	// TakeGroup decides reqs in order, each as its Policy's Take (or
	// Charge, when Force) would, and sets each one's Decision. Concurrent
	// requests see all of the group's charges or none: a request later in
	// the group sees what earlier ones on its key charged. A store that
	// cannot decide a group in one step may call each request's Policy in
	// turn and give back, latest first, what an undone group charged;
	// others can then see the charges until they are given back.
	//
	// With all set, the group is all or nothing: when a request that is not
	// Advisory is denied, what the others charged is given back (as Refund
	// does, at the same instant) before anyone else can see it. The
	// Decisions of the requests so undone are not Allowed, have a Retry of
	// 0 (their own limits admit them; a denial's Retry is never 0), and
	// report the state after the refund.
	//
	// Its errors are Take's, for the first request that has one, or, for a
	// request whose Policy another Store prepared, one wrapping
	// ErrInvalidLimit; on an
	// error no Decision is to be used, and nothing is charged unless the
	// store failed part way. It keeps nothing of reqs once it returns, even
	// when ctx ends first: callers reuse them.
	TakeGroup(ctx context.Context, reqs []Request, all bool) error
	// Close releases the store's resources; its Policies then fail with
	// ErrClosed. It is safe to call more than once; calls after the first
	// return nil and do nothing.
	Close() error
}

// Policy decides requests on keys against the limits a Store prepared it
// with. Its methods return an error only when the input is invalid
// (wrapping ErrInvalidKey or ErrInvalidCost), the context ended, or the
// store failed (wrapping ErrStore or ErrClosed; ErrKey, which is ErrStore
// too, when it failed on that key alone); a denied request is a
// Decision, not an error.
//
// Every method is part of the contract. A store that cannot keep
// overrides or rebase returns an error wrapping errors.ErrUnsupported
// from those methods (storetest then skips their scenarios); Take,
// Charge, Refund and Reset it must implement.
type Policy interface {
	// Take decides whether a request of cost n on key passes every limit,
	// and charges all of them if it does; if any limit denies, none is
	// charged. It is atomic: concurrent Takes on a key behave as if run
	// one after the other. n = 0 peeks: it reports the state and changes
	// nothing.
	Take(ctx context.Context, key string, n int64) (Decision, error)
	// Charge charges n on key against every limit, as Spec.Charge does:
	// always, at most each limit's quota, possibly into debt, so that
	// later requests wait until it is repaid. The Decision is allowed and
	// reports the state after the charge. Its errors are Take's. The
	// fallback store uses it to charge Redis, when it is back, for what
	// its local limiter admitted while Redis was away.
	Charge(ctx context.Context, key string, n int64) (Decision, error)
	// Refund gives n units back to key on every limit, as Spec.Refund
	// does: exactly, and never beyond a limit's quota; a key that is full
	// stays as it is. The Decision is allowed and reports the state after
	// the refund. Its errors are Take's.
	Refund(ctx context.Context, key string, n int64) (Decision, error)
	// Reset forgets the state of key for the limits, so that it is full
	// again.
	Reset(ctx context.Context, key string) error

	// An override belongs to the key in the store, not to the Policy:
	// every Policy of the store decides the key against it. The Policy
	// that sets or deletes one supplies the limits the key had or goes
	// back to (its own), so that the key's usage is carried over by the
	// Strategy. Setting or deleting an override is atomic with the
	// carry-over: no decision sees the new limits with the old usage, or
	// the reverse.

	// SetOverride gives key the override o, or, when o is nil, deletes
	// key's override, so that it goes back to the Policy's limits. The
	// key's usage goes from its old limits (its override, or the Policy's)
	// to the new ones as st says. Errors wrap ErrInvalidKey (a key that
	// Take would refuse), ErrInvalidLimit (an unknown st; an o whose
	// Limits Prepare would refuse, with ErrNoLimits for their number, or
	// that has a calendar window; a TTL that is negative or not whole
	// milliseconds) or ErrStore; a failed call changes nothing.
	SetOverride(ctx context.Context, key string, o *Override, st Strategy) error
	// GetOverride returns key's override and true, or false when it has
	// none (or it expired).
	GetOverride(ctx context.Context, key string) (Override, bool, error)
	// ListOverrides calls fn with every override of the store, in no
	// particular order, until fn returns false. Overrides set or deleted
	// meanwhile may or may not be seen.
	ListOverrides(ctx context.Context, fn func(key string, o Override) bool) error

	// Rebase moves the usage of the keys the store holds from other limits
	// to the Policy's: how a changed limit keeps what was used when the
	// Policy is replaced rather than a key overridden, as when a rules
	// file is reloaded. It records the Policy's limits as those of the
	// keys that start with scope (a non-empty prefix, such as a rule's).
	// When other limits were recorded for scope before, it carries the
	// usage of every key in scope that the store holds and that has no
	// override from those limits to the Policy's as st says, and returns
	// how many keys it carried. When the same limits were recorded, or
	// none, it changes nothing and returns 0: calling it again, or from
	// every process that shares the store, carries each key once.
	//
	// Calendar windows keep their count: when the old or the new limits
	// include one, Rebase records the new limits and carries nothing.
	//
	// Each key is carried atomically, one after another; a key decided
	// between the swap to the new limits and its carry is decided on its
	// state as it stands, and then carried. Errors wrap ErrInvalidKey
	// (an empty scope), ErrInvalidLimit (an unknown st) or ErrStore. The
	// new limits are recorded before the first key is carried, so that
	// no key is carried twice: after an error, the keys not yet carried
	// are read under the new limits as they stand.
	Rebase(ctx context.Context, scope string, st Strategy) (int, error)
}

// Partitioner is implemented by a Store whose keys live on servers that
// fail apart, such as the masters of a Redis Cluster. The fallback store
// keeps one breaker per partition, so that one dead server sends only its
// own keys to the local limiter. It is optional: a Store without it is
// one partition.
type Partitioner interface {
	// Partitioned reports whether keys are spread over several servers.
	Partitioned() bool
	// Partition names the server that holds key's state, or returns ""
	// when that is not known. It does no I/O that waits.
	Partition(key string) string
}
