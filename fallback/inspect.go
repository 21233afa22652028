package fallback

import (
	"context"
	"errors"
	"fmt"

	"github.com/floodgate/floodgate"
	"github.com/floodgate/floodgate/core"
	"github.com/floodgate/floodgate/internal/lib/storekit"
)

// This file is core.Inspector for the fallback store: which of the
// primary and the mode answers a key, with the state each holds.

var _ core.Inspector = (*policy)(nil)

// Inspect implements core.Inspector. While the key's breaker is closed it
// inspects the primary (within the budget, when the primary is a
// core.Inspector) and reports the local limiter's share beside it; while
// it is open, or when the primary fails to answer the inspection, the
// mode's answer, with Fallback.Degraded set. An inspection is not a
// decision: it neither counts against the primary's breaker nor as a
// fallback decision, and charges nothing anywhere. A primary that is not
// a core.Inspector gives an error wrapping errors.ErrUnsupported while
// it answers.
func (p *policy) Inspect(ctx context.Context, key string) (core.Inspection, error) {
	if err := storekit.CheckRequest(key, 0); err != nil {
		return core.Inspection{}, err
	}
	s := p.s
	if s.closed.Load() {
		return core.Inspection{}, floodgate.ErrClosed
	}
	fb := &core.FallbackInspection{Mode: s.mode.String(), Instances: s.instances}
	var local core.Inspection
	if li, ok := p.local.(core.Inspector); ok {
		var err error
		if local, err = li.Inspect(ctx, key); err != nil {
			return core.Inspection{}, err
		}
		fb.Local = local.Verdicts
	}
	b := s.breaker(key)
	if !b.degraded.Load() {
		pi, ok := p.primary.(core.Inspector)
		if !ok {
			return core.Inspection{}, fmt.Errorf("fallback: the primary store cannot inspect a key: %w", errors.ErrUnsupported)
		}
		var in core.Inspection
		_, err := b.call(ctx, func(ctx context.Context) (core.Decision, error) {
			var err error
			in, err = pi.Inspect(ctx, key)
			return in.Decision, err
		})
		switch {
		case err == nil:
			if local.Verdicts != nil && len(local.Verdicts) != len(in.Verdicts) {
				fb.Local = nil // an override's shares, not mirrored yet
			}
			in.Fallback = fb
			return in, nil
		case ctx.Err() != nil:
			return core.Inspection{}, ctx.Err()
		case storekit.IsInvalidInput(err), errors.Is(err, floodgate.ErrKey):
			return core.Inspection{}, err
		}
	}
	fb.Degraded = true
	var in core.Inspection
	switch s.mode {
	case FailOpen, FailClosed:
		in.Verdicts = make([]core.Verdict, len(p.specs))
		for i := range in.Verdicts {
			// As answer gives them: everything, or nothing until a probe.
			v := &in.Verdicts[i]
			if s.mode == FailOpen {
				v.Allowed, v.Remaining = true, p.specs[i].Quota
			} else {
				v.Retry, v.Reset = s.interval.Microseconds(), s.interval.Microseconds()
			}
		}
		in.Decision = core.Decide(in.Verdicts)
		in.Source = core.SourceFailOpen
		if s.mode == FailClosed {
			in.Source = core.SourceFailClosed
		}
	default:
		in = local
		in.Source = core.SourceLocal
	}
	in.Fallback = fb
	return in, nil
}
