package fallback

import (
	"context"

	"github.com/floodgate/floodgate"
	"github.com/floodgate/floodgate/core"
	"github.com/floodgate/floodgate/internal/lib/storekit"
)

// TakeGroup implements core.Store.TakeGroup. When every request's key is
// in one partition of the primary and its breaker is closed, the primary
// decides the group in one step, within the budget. When the primary fails, or its breaker is open, the failure
// mode answers at once, without asking the primary again: under Local,
// the local limiter decides the group in one step, as it decides a Take
// (and its admissions go to the ledger); under FailOpen and FailClosed,
// every request gets the mode's answer. A group whose keys span
// partitions is decided by storekit.TakeEach. Each
// request's Policy must be one that s prepared.
func (s *Store) TakeGroup(ctx context.Context, reqs []core.Request, all bool) error {
	if err := storekit.CheckGroup(reqs); err != nil {
		return err
	}
	if s.closed.Load() {
		return floodgate.ErrClosed
	}
	if len(reqs) == 0 {
		return nil
	}
	pp := s.groupPols.Get(len(reqs))
	defer s.groupPols.Put(pp)
	pols := *pp
	b := s.breaker(reqs[0].Key)
	one := true
	for i := range reqs {
		p, ok := reqs[i].Policy.(*policy)
		if !ok || p.s != s {
			return storekit.ForeignPolicy(i, reqs[i].Policy)
		}
		pols[i] = p
		one = one && (s.parts == nil || s.breaker(reqs[i].Key) == b)
	}
	g := s.primary
	if !one {
		return storekit.TakeEach(ctx, reqs, all)
	}
	sp := s.groupReqs.Get(len(reqs))
	defer s.groupReqs.Put(sp)
	sub := *sp
	for i, r := range reqs {
		sub[i] = core.Request{Policy: pols[i].primary, Key: r.Key, N: r.N, Force: r.Force, Advisory: r.Advisory}
	}
	_, done, err := pols[0].primaryFirst(ctx, b, func(ctx context.Context) (core.Decision, error) {
		return core.Decision{}, g.TakeGroup(ctx, sub, all)
	})
	if done {
		if err != nil {
			return err
		}
		for i := range reqs {
			reqs[i].Decision = sub[i].Decision
			pols[i].sync(reqs[i].Key, reqs[i].N, &reqs[i].Decision)
		}
		return nil
	}
	if s.mode != Local {
		// Fail open or closed, at once: the primary just failed the
		// group, so nothing is asked of it again.
		for i := range reqs {
			r := &reqs[i]
			if r.Force {
				r.Decision, err = pols[i].answer(ctx, r.Key, 0, b)
				r.Decision.Allowed = true // a charge is always allowed, as Charge's
			} else {
				r.Decision, err = pols[i].answer(ctx, r.Key, r.N, b)
			}
			if err != nil {
				return err
			}
		}
		return nil
	}
	lg := s.local
	for i := range sub {
		sub[i].Policy = pols[i].local
	}
	s.stats.fallbacks.Add(uint64(len(reqs)))
	if err := lg.TakeGroup(ctx, sub, all); err != nil {
		return err
	}
	for i := range reqs {
		d := &reqs[i].Decision
		*d = sub[i].Decision
		d.Source = core.SourceLocal
		if d.Allowed && reqs[i].N > 0 {
			pols[i].record(reqs[i].Key, reqs[i].N, s.breaker(reqs[i].Key))
		}
	}
	return nil
}
