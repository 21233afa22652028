// Package core is what every floodgate store decides with: the algorithms
// as pure functions of (state, limit, now, cost), their exact integer
// arithmetic and rounding, the validation of limits, the bounds on a
// request, and the combining of several limits into one decision. Applications use package
// floodgate; this package is for writing a Store.
//
// # The pieces
//
//   - Spec is a limit compiled for deciding: its Kind, parameters in
//     microseconds, and the bucket's emission interval and tolerance
//     worked out once. floodgate.NewLimiter compiles its Limits to Specs
//     and hands them to Store.Prepare.
//   - State is one limit's state on one key; the zero State means "full".
//   - Spec.Step decides a request of cost n at a time now (µs) against a
//     State, without changing it, and returns a Verdict and a Delta;
//     Commit applies the Delta when the request is charged. Several limits
//     on one key are stepped first and committed only if all allow.
//   - Decide combines the limits' Verdicts into the Decision that a
//     Policy returns.
//   - The sentinel errors (ErrInvalidKey, ErrInvalidCost, ErrNoLimits,
//     ErrInvalidLimit) are what a Store returns, wrapped with %w, for bad
//     input; Store, Policy and the bounds (MaxKeyLen, MaxLimits,
//     MaxLogQuota, ...) say what input is bad. A Store checks its own
//     input: floodgate's stores share their checks internally.
//   - Concurrency limits (slots) are optional and not here: a Store that
//     offers them implements package core/slot as well.
//
// # Writing a Store
//
// A Store (floodgate.Store) prepares limits once and decides requests
// through the Policy it returns:
//
//	type Store struct{ ... }
//
//	func (s *Store) Prepare(limits []core.Spec) (core.Policy, error) {
//		// 1 to core.MaxLimits limits (else core.ErrNoLimits), each
//		// valid (Spec.Validate), and sliding logs that admit at most
//		// core.MaxLogQuota units together (else core.ErrInvalidLimit).
//		if err := checkLimits(limits); err != nil {
//			return nil, err
//		}
//		// Work out here, once, whatever every decision would repeat.
//		return &policy{s: s, specs: slices.Clone(limits)}, nil
//	}
//
//	func (p *policy) Take(ctx context.Context, key string, n int64) (core.Decision, error) {
//		if key == "" || len(key) > core.MaxKeyLen {
//			return core.Decision{}, fmt.Errorf("%w: %d bytes", core.ErrInvalidKey, len(key))
//		}
//		if n < 0 {
//			return core.Decision{}, fmt.Errorf("%w: %d", core.ErrInvalidCost, n)
//		}
//		// Atomically, for this key (a lock, a transaction, a script):
//		//   load one core.State per limit (a missing key is the zero State;
//		//   zero a State whose Kind is not its limit's);
//		//   v[i], d[i] := p.specs[i].Step(&states[i], now, n) for every limit;
//		//   charged := every v[i].Allowed && n > 0;
//		//   p.specs[i].Commit(&states[i], d[i], now, n, charged) for every limit;
//		//   store the states; a key may be dropped after now + the
//		//   largest p.specs[i].Hold(v[i], d[i], now), when every limit
//		//   is full again (and a key that saw the clock step back has
//		//   rejoined it).
//		return core.Decide(v), nil
//	}
//
// The time now is integer microseconds since the Unix epoch, read once per
// decision from one clock (the store's, or an injected floodgate.Clock).
// Charge and Refund are Take with Spec.Charge and Spec.Refund for Step.
// Reset forgets the key's states. Store.TakeGroup may call the requests'
// Policies one after another, at the cost of atomicity; SetOverride,
// GetOverride, ListOverrides and Rebase may return an error wrapping
// errors.ErrUnsupported when the store keeps no overrides (Strategy and
// Policy.Rebase say how a store that keeps them carries usage). Close
// makes Prepare and every Policy fail with ErrClosed, and is safe to call
// twice. A denial is a Decision, never an error; store failures wrap
// ErrStore, and a failure on one key alone (data that is not the store's,
// a refused command) wraps ErrKey.
//
// Then run the conformance suite, package storetest, on it: the
// hand-computed scenarios, other limiters' published test vectors, the
// error table and a concurrency check must all pass unchanged, so that it
// answers exactly as the memory store and the Redis store do.
//
// A store that cannot run Go where the state lives (the Redis store runs
// Lua inside Redis) must mirror Step and Commit there, function for
// function; redisstore's prelude.lua and decide.lua show how, and its
// differential fuzz test is the way to hold such a mirror to the Go.
package core
