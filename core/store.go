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
	// Prepare validates limits (with CheckSpecs) and returns the Policy
	// that decides requests against all of them as one. It does no I/O.
	// Its errors wrap ErrInvalidLimit, ErrNoLimits or ErrClosed.
	Prepare(limits []Spec) (Policy, error)
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
type Policy interface {
	// Take decides whether a request of cost n on key passes every limit,
	// and charges all of them if it does; if any limit denies, none is
	// charged. It is atomic: concurrent Takes on a key behave as if run
	// one after the other. n = 0 peeks: it reports the state and changes
	// nothing.
	Take(ctx context.Context, key string, n int64) (Decision, error)
	// Reset forgets the state of key for the limits, so that it is full
	// again.
	Reset(ctx context.Context, key string) error
}

// Charger is implemented by a Policy that can charge a cost whatever its
// limits say. The memory and Redis stores implement it, and the fallback
// store uses it to charge Redis, when it is back, for what its local
// limiter admitted while Redis was away.
type Charger interface {
	// Charge charges n on key against every limit, as Spec.Charge does:
	// always, at most each limit's quota, possibly into debt, so that
	// later requests wait until it is repaid. The Decision is allowed and
	// reports the state after the charge. Its errors are Take's.
	Charge(ctx context.Context, key string, n int64) (Decision, error)
}

// Partitioner is implemented by a Store whose keys live on servers that
// fail apart, such as the masters of a Redis Cluster. The fallback store
// keeps one breaker per partition, so that one dead server sends only its
// own keys to the local limiter.
type Partitioner interface {
	// Partitioned reports whether keys are spread over several servers.
	Partitioned() bool
	// Partition names the server that holds key's state, or returns ""
	// when that is not known. It does no I/O that waits.
	Partition(key string) string
}

// Refunder is implemented by a Policy that can give units back. The
// memory, Redis and fallback stores implement it.
type Refunder interface {
	// Refund gives n units back to key on every limit, as Spec.Refund
	// does: exactly, and never beyond a limit's quota; a key that is full
	// stays as it is. The Decision is allowed and reports the state after
	// the refund. Its errors are Take's.
	Refund(ctx context.Context, key string, n int64) (Decision, error)
}
