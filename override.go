package floodgate

import (
	"context"
	"fmt"
	"time"

	"github.com/floodgate/floodgate/core"
)

// Strategy says what a key keeps of what it has used when its limits
// change, as bucket4j's TokensInheritanceStrategy does. With a capacity of
// 100 and 40 units left, raised to 200, a key is left with 140 (Additive,
// the default), 40 (AsIs), 80 (Proportional) or 200 (ResetUsage). See
// core.Strategy.
type Strategy = core.Strategy

// The strategies.
const (
	// Additive keeps what was used: a raised limit adds the difference to
	// what is left; a lowered one keeps what is left, up to the new quota.
	// It is the zero value and the default.
	Additive = core.Additive
	// AsIs keeps what is left, up to the new quota.
	AsIs = core.AsIs
	// Proportional keeps the fraction that is left, rounded down.
	Proportional = core.Proportional
	// ResetUsage forgets what was used: the key is full under its new
	// limits.
	ResetUsage = core.ResetUsage
)

// ParseStrategy returns the Strategy named s: "additive" (or ""),
// "as-is", "proportional" or "reset".
func ParseStrategy(s string) (Strategy, error) {
	if s == "" {
		return Additive, nil
	}
	for st := Additive; st <= ResetUsage; st++ {
		if st.String() == s {
			return st, nil
		}
	}
	return 0, fmt.Errorf("%w: unknown strategy %q (additive, as-is, proportional or reset)", ErrInvalidLimit, s)
}

// Override is one key's own limits, which replace a Limiter's on that key:
// a tenant who bought ten times the quota, an abuser held to less.
type Override struct {
	// Limits are the key's limits: 1 to MaxLimits, any algorithm but a
	// calendar window.
	Limits []Limit
	// TTL is how long the override lasts, in whole milliseconds; 0 for
	// ever. GetOverride reports the time left.
	TTL time.Duration
}

// SetOverride gives key its own limits, on every Limiter of the store and
// in every process that shares it (the Redis store keeps overrides in
// Redis; each decision reads its key's override in the same script call).
// What the key has used carries over as st says, atomically with the
// change: no decision sees the new limits with the old usage. Setting an
// override on a key that has one replaces it, carrying from the old
// override's limits.
//
// When the override expires, the key goes back to the Limiter's limits
// with its state as it stands (which is Additive for limits that differ
// only in quota); DeleteOverride chooses the strategy.
//
// The errors wrap ErrInvalidKey, ErrInvalidLimit or ErrNoLimits for bad
// input, and ErrStore when the store failed; either way nothing changed.
// A store that keeps no overrides gives an error wrapping
// errors.ErrUnsupported.
func (l *Limiter) SetOverride(ctx context.Context, key string, o Override, st Strategy) error {
	specs, err := compile(o.Limits)
	if err != nil {
		return fmt.Errorf("override: %w", err)
	}
	return l.policy.SetOverride(ctx, key, &core.Override{Limits: specs, TTL: o.TTL}, st)
}

// DeleteOverride takes key's override away, so that the Limiter's limits
// apply to it again, carrying what it has used as st says. Deleting an
// override that does not exist carries from the Limiter's limits to
// themselves, which changes nothing but under AsIs and ResetUsage.
func (l *Limiter) DeleteOverride(ctx context.Context, key string, st Strategy) error {
	return l.policy.SetOverride(ctx, key, nil, st)
}

// GetOverride returns key's override and true, with the time it has left
// as its TTL, or false when the key has none.
func (l *Limiter) GetOverride(ctx context.Context, key string) (Override, bool, error) {
	o, ok, err := l.policy.GetOverride(ctx, key)
	if !ok || err != nil {
		return Override{}, false, err
	}
	return exportOverride(o), true, nil
}

// ListOverrides calls fn with every override of the Limiter's store, in
// no particular order, until fn returns false.
func (l *Limiter) ListOverrides(ctx context.Context, fn func(key string, o Override) bool) error {
	return l.policy.ListOverrides(ctx, func(key string, o core.Override) bool {
		return fn(key, exportOverride(o))
	})
}

// Rebase makes the Limiter's limits those of every key that starts with
// scope, keeping what the keys have used: when the store recorded other
// limits for scope (a Limiter built before this one with other limits
// called Rebase), each key the store holds in scope is carried from those
// limits to the Limiter's as st says, and Rebase returns how many. Keys
// with an override keep it. Call it when a Limiter replaces another on
// the same keys with new limits, as floodgate serve does for a rule when
// its rules file is reloaded; every process may call it, and each key is
// carried once.
//
// The first call for a scope, and a call with the limits already
// recorded, only records them. Calendar windows keep their count (nothing
// is carried when the old or new limits have one). A key decided between
// the swap to this Limiter and its carry is decided on its state as it
// stands and carried after. Errors wrap ErrInvalidKey (an empty scope),
// ErrInvalidLimit (an unknown st) or ErrStore; a store that cannot
// rebase gives an error wrapping errors.ErrUnsupported.
func (l *Limiter) Rebase(ctx context.Context, scope string, st Strategy) (int, error) {
	return l.policy.Rebase(ctx, scope, st)
}

func exportOverride(o core.Override) Override {
	out := Override{Limits: make([]Limit, len(o.Limits)), TTL: o.TTL}
	for i, sp := range o.Limits {
		out.Limits[i] = limitOf(sp)
	}
	return out
}
