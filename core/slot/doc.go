// Package slot is the contract of a store that keeps concurrency limits
// (slots). It is optional: a Store (package core) decides rate limits
// alone, and only a store that also offers slots implements this
// package's Store. Applications use floodgate.Concurrency.
//
// Concurrency limits (slots) bound how many requests on a key are in
// flight at once, where the rate limits bound how often. A Spec is N
// slots per key with a lease L; Acquire takes a slot and returns a permit
// (an id and an expiry), Release gives it back exactly once, Extend renews
// it for another L, and a permit neither released nor extended within L
// frees its slot by itself, so a holder that dies loses its slots at most
// L later and never sooner.
//
// Slots are their own type rather than a core.Kind of core.Spec, because
// they share nothing of a rate limit's contract but the key: an acquire
// returns a permit that only its holder can give back, and release and
// extend name that permit, where every core.Policy method takes a key and
// a cost. As a Kind, every core.Store, the Lua protocol, overrides,
// carries, rebases, refunds, forced charges, leases and the denial cache
// would each need a meaning for "slots" that they do not have (what is a
// refund of a permit nobody named, or a forced charge over N?), and every
// Take would carry a permit id it does not use. A separate Store keeps the
// rate limits' contract as it is and gives the slots the three operations
// they need; a separate package keeps it out of what a store author of
// rate limits must read.
package slot
