package fallback

import (
	"context"
	"slices"

	"github.com/floodgate/floodgate"
	"github.com/floodgate/floodgate/core"
	"github.com/floodgate/floodgate/internal/lib/storekit"
)

// This file passes overrides through to the primary, which keeps them
// for every process, and mirrors them in the local store, as shares, so
// that an overridden key keeps its own limits when the primary fails.
// Overrides that other processes set are learnt from the primary's
// decisions, which carry the key's override.

var _ core.Policy = (*policy)(nil)

// SetOverride implements core.Policy: it sets the override on the
// primary, within the budget, and then mirrors it in the local store. A
// primary that fails changes nothing, and its error is returned: an
// override is shared state that only the primary can hold.
func (p *policy) SetOverride(ctx context.Context, key string, o *core.Override, st core.Strategy) error {
	if err := storekit.CheckOverride(key, o, st); err != nil {
		return err
	}
	po, err := p.openPrimary()
	if err != nil {
		return err
	}
	if _, err := p.s.breaker(key).call(ctx, func(ctx context.Context) (core.Decision, error) {
		return core.Decision{}, po.SetOverride(ctx, key, o, st)
	}); err != nil {
		return err
	}
	if o == nil {
		p.mirror(ctx, key, nil, st)
	} else {
		p.mirror(ctx, key, o, st)
	}
	return nil
}

// GetOverride implements core.Policy: the primary's answer.
func (p *policy) GetOverride(ctx context.Context, key string) (o core.Override, ok bool, err error) {
	po, err := p.openPrimary()
	if err != nil {
		return core.Override{}, false, err
	}
	_, err = p.s.breaker(key).call(ctx, func(ctx context.Context) (core.Decision, error) {
		o, ok, err = po.GetOverride(ctx, key)
		return core.Decision{}, err
	})
	return o, ok, err
}

// ListOverrides implements core.Policy: the primary's.
func (p *policy) ListOverrides(ctx context.Context, fn func(key string, o core.Override) bool) error {
	po, err := p.openPrimary()
	if err != nil {
		return err
	}
	return po.ListOverrides(ctx, fn)
}

// openPrimary returns the primary's policy, or ErrClosed after Close.
func (p *policy) openPrimary() (core.Policy, error) {
	if p.s.closed.Load() {
		return nil, floodgate.ErrClosed
	}
	return p.primary, nil
}

// mirror gives key in the local store the shares of o's limits, or
// deletes its local override when o is nil, and remembers what it
// mirrored.
func (p *policy) mirror(ctx context.Context, key string, o *core.Override, st core.Strategy) {
	lo := p.local
	if lo == nil {
		return
	}
	if o == nil {
		if lo.SetOverride(ctx, key, nil, st) == nil {
			p.s.mirrored.Delete(key)
		}
		return
	}
	shares := make([]core.Spec, len(o.Limits))
	for i := range o.Limits {
		var err error
		if shares[i], err = o.Limits[i].Share(p.s.instances); err != nil {
			return
		}
	}
	if lo.SetOverride(ctx, key, &core.Override{Limits: shares, TTL: o.TTL}, st) == nil {
		p.s.mirrored.Store(key, slices.Clone(o.Limits))
	}
}

// learn mirrors the override that a decision of the primary reports for
// key, if it is not the one mirrored already: one set by another process.
func (p *policy) learn(ctx context.Context, key string, d *core.Decision) {
	v, had := p.s.mirrored.Load(key)
	switch {
	case d.Limits == nil && had:
		p.mirror(ctx, key, nil, core.Additive)
	case d.Limits != nil && (!had || !slices.Equal(v.([]core.Spec), d.Limits)):
		p.mirror(ctx, key, &core.Override{Limits: d.Limits}, core.Additive)
	}
}

// Rebase implements core.Policy.Rebase: the primary's, without a budget, as it
// scans every key of the scope; then the local store's, whose keys hold
// shares of the limits. The primary's error is returned; the local
// store's rebase is done whatever it says, as local state never waits for
// the primary.
func (p *policy) Rebase(ctx context.Context, scope string, st core.Strategy) (int, error) {
	if err := storekit.CheckRebase(scope, st); err != nil {
		return 0, err
	}
	if p.s.closed.Load() {
		return 0, floodgate.ErrClosed
	}
	n, err := p.primary.Rebase(ctx, scope, st)
	if lr := p.local; lr != nil {
		if _, lerr := lr.Rebase(ctx, scope, st); err == nil {
			err = lerr
		}
	}
	return n, err
}
