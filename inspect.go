package floodgate

import (
	"context"
	"errors"
	"fmt"

	"github.com/floodgate/floodgate/core"

	"github.com/floodgate/floodgate/internal/lib/storekit"
)

// Inspection is what Limiter.Inspect reports of a key: its state under
// every limit in force, and which parts of the store answer for it.
type Inspection struct {
	// Result is the key's state as Peek reports it: Index and Name say
	// which limit decides (the one closest to denying), Overridden
	// whether the key has an override, Source who answered.
	Result
	// Limits are the limits in force for the key: its override's when
	// Overridden, else the Limiter's.
	Limits []Limit
	// Results holds each limit's state, one per limit of Limits, in
	// order: what a peek of that limit alone reports (allowed, with a
	// RetryAfter of 0). When a fallback's local limiter answers (Source
	// SourceLocal), each is of the limit's local share, Quota included.
	Results []Result
	// Lease is how many units of a lease this process holds on the key
	// (redisstore's Options.Leases): taken from the store already, so not
	// in Remaining, and admitted by this process without asking it. 0
	// without one.
	Lease int64
	// DenialCached reports that this process caches a denial of the key
	// (redisstore's denial cache): a request like the one denied is
	// answered from it until its RetryAfter.
	DenialCached bool
	// Fallback is set when the store is a fallback store (package
	// fallback); nil otherwise.
	Fallback *FallbackInspection
}

// FallbackInspection is what a fallback store reports of a key.
type FallbackInspection struct {
	// Mode is the failure mode: "local", "fail-open" or "fail-closed".
	Mode string
	// Degraded reports that the key's primary store is failing (it did
	// not answer the inspection, or its breaker is open), so that the
	// mode answers its requests.
	Degraded bool
	// Instances is how many processes share the limits: the local
	// limiter applies 1/Instances of each.
	Instances int64
	// Local holds the local limiter's state of the key, one Result per
	// limit of its shares (a Quota of 1/Instances), in the local mode;
	// nil otherwise.
	Local []Result
}

// Inspect reports key's state under each of its limits, and which parts
// of the store answer for it (a lease, a cached denial, a fallback),
// without charging anything: it is for explaining decisions, not for
// making them. It needs a store whose Policies implement core.Inspector,
// as the memory, Redis and fallback stores do; with another, the error
// wraps errors.ErrUnsupported. Its other errors are Peek's.
func (l *Limiter) Inspect(ctx context.Context, key string) (Inspection, error) {
	in, ok := l.policy.(core.Inspector)
	if !ok {
		return Inspection{}, fmt.Errorf("floodgate: the store cannot inspect a key: %w", errors.ErrUnsupported)
	}
	ci, err := in.Inspect(ctx, key)
	if err != nil {
		return Inspection{}, err
	}
	specs := l.specs
	if ci.Limits != nil {
		specs = ci.Limits
	}
	if len(ci.Verdicts) != len(specs) || ci.Index < 0 || ci.Index >= len(specs) {
		return Inspection{}, fmt.Errorf("%w: the store's inspection has %d verdicts for %d limits", ErrStore, len(ci.Verdicts), len(specs))
	}
	out := Inspection{Result: result(l.specs, &ci.Decision), Lease: ci.Lease, DenialCached: ci.DenialCached}
	// The local limiter's verdicts are of each limit's share.
	var shares []core.Spec
	if fb := ci.Fallback; fb != nil {
		shares = make([]core.Spec, len(specs))
		for i := range specs {
			var err error
			if shares[i], err = specs[i].Share(max(fb.Instances, 1)); err != nil {
				return Inspection{}, err
			}
		}
	}
	out.Limits = make([]Limit, len(specs))
	out.Results = make([]Result, len(specs))
	for i := range specs {
		out.Limits[i] = limitOf(specs[i])
		if ci.Limits == nil {
			out.Limits[i] = l.limits[i] // keeps its calendar's location
		}
		sp := &specs[i]
		if ci.Source == SourceLocal && shares != nil {
			sp = &shares[i]
		}
		fillVerdict(&out.Results[i], sp, &ci.Verdicts[i], i)
		out.Results[i].Overridden, out.Results[i].Source = out.Overridden, out.Source
	}
	if fb := ci.Fallback; fb != nil {
		out.Fallback = &FallbackInspection{Mode: fb.Mode, Degraded: fb.Degraded, Instances: fb.Instances}
		if len(fb.Local) == len(specs) {
			out.Fallback.Local = make([]Result, len(specs))
			for i := range specs {
				fillVerdict(&out.Fallback.Local[i], &shares[i], &fb.Local[i], i)
				out.Fallback.Local[i].Source = SourceLocal
			}
		}
	}
	return out, nil
}

// Inspect implements core.Inspector: it steps each of key's states with
// a cost of 0 under the shard's lock, and changes nothing, not even the
// key's place in the eviction order.
func (p *memPolicy) Inspect(ctx context.Context, key string) (core.Inspection, error) {
	if err := storekit.CheckRequest(key, 0); err != nil {
		return core.Inspection{}, err
	}
	s := p.s
	if s.closed.Load() {
		return core.Inspection{}, ErrClosed
	}
	if err := ctx.Err(); err != nil {
		return core.Inspection{}, err
	}
	h, sh := s.locate(key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	now := s.now()
	q, limits := p, []core.Spec(nil)
	if ov := sh.override(key, now); ov != nil {
		q, limits = ov.pol, ov.pol.specs
	}
	vs := make([]core.Verdict, len(q.specs))
	var states []core.State
	e := sh.idx.lookup(h, key)
	if e != nil {
		// A decision on a protected key takes e's lock alone: the states
		// (a sliding log's marks too) are read under it.
		e.mu.Lock()
		defer e.mu.Unlock()
		states = e.states
	}
	for i := range q.specs {
		var st core.State
		if i < len(states) && states[i].Kind == q.specs[i].Kind {
			st = states[i]
		}
		vs[i], _ = q.specs[i].Step(&st, now, 0) // Step changes nothing
	}
	d := core.Decide(vs)
	d.Limits = limits
	return core.Inspection{Decision: d, Verdicts: vs}, nil
}
