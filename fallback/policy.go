package fallback

import (
	"context"
	"errors"
	"fmt"
	"strconv"

	"github.com/floodgate/floodgate"
	"github.com/floodgate/floodgate/core"
	"github.com/floodgate/floodgate/internal/lib/storekit"
)

// This file is the per-call decision path: the primary first, within the
// budget, and the mode's answer when it fails.

// Mode is what a Store answers while its primary store is failing.
type Mode uint8

// The modes; docs/fallback.md compares them.
const (
	// Local answers from a local in-memory limiter that applies each
	// limit's share (core.Spec.Share) of Instances. Limiting goes on, per process, at about
	// the global rate when Instances is right. It is the default.
	Local Mode = iota
	// FailOpen allows every request. Nothing is limited during an outage:
	// pick it when a false denial costs more than abuse.
	FailOpen
	// FailClosed denies every request, with RetryAfter set to the probe
	// interval. Nothing gets through during an outage: pick it when the
	// limit protects something that must never be exceeded.
	FailClosed
)

// String returns "local", "fail-open" or "fail-closed".
func (p Mode) String() string {
	switch p {
	case Local:
		return "local"
	case FailOpen:
		return "fail-open"
	case FailClosed:
		return "fail-closed"
	}
	return "Mode(" + strconv.Itoa(int(p)) + ")"
}

// ParseMode returns the Mode whose String is s.
func ParseMode(s string) (Mode, error) {
	for _, p := range []Mode{Local, FailOpen, FailClosed} {
		if p.String() == s {
			return p, nil
		}
	}
	return 0, fmt.Errorf("fallback: unknown mode %q (want local, fail-open or fail-closed)", s)
}

// policy is the Store's core.Policy: the primary's policy, and the
// local store's policy of the limits' shares.
type policy struct {
	s       *Store
	primary core.Policy
	local   core.Policy // nil unless the mode is Local
	quota   int64       // the first limit's, for fail-open and fail-closed answers
	specs   []core.Spec // the limits, for Inspect's answers in the fail modes
}

// Take implements core.Policy. It returns the primary's decision when
// the primary answers within the budget, and otherwise the mode's, with
// Source telling which. Its errors are input errors, floodgate.ErrClosed,
// the caller's own context error when ctx ends first (never counted as a
// failure of the primary), the primary's errors about key alone
// (floodgate.ErrKey, never counted either: one poisoned key must not
// send every key to the mode), and the local store's errors.
func (p *policy) Take(ctx context.Context, key string, n int64) (core.Decision, error) {
	if err := storekit.CheckRequest(key, n); err != nil {
		return core.Decision{}, err
	}
	s := p.s
	if s.closed.Load() {
		return core.Decision{}, floodgate.ErrClosed
	}
	b := s.breaker(key)
	d, done, err := p.primaryFirst(ctx, b, func(ctx context.Context) (core.Decision, error) {
		return p.primary.Take(ctx, key, n)
	})
	if done {
		if err == nil {
			p.sync(key, n, &d)
		}
		return d, err
	}
	return p.answer(ctx, key, n, b)
}

// primaryFirst calls f on the primary unless b is open. It returns the
// primary's Decision and done when the primary answered; done and an
// error when the caller's context ended, the input is invalid, or the
// primary failed on this key alone (floodgate.ErrKey; none of them
// counts against the primary); and not done otherwise, when the mode
// answers (b has counted the failure).
func (p *policy) primaryFirst(ctx context.Context, b *breaker, f func(context.Context) (core.Decision, error)) (d core.Decision, done bool, err error) {
	if b.degraded.Load() {
		return core.Decision{}, false, nil
	}
	d, err = b.call(ctx, f)
	if err == nil {
		return d, true, nil
	}
	if ctxErr := ctx.Err(); ctxErr != nil {
		return core.Decision{}, true, ctxErr
	}
	if storekit.IsInvalidInput(err) {
		return core.Decision{}, true, err
	}
	if errors.Is(err, floodgate.ErrKey) {
		s := p.s
		s.stats.keyErrors.Add(1)
		return core.Decision{}, true, err
	}
	b.failed(err)
	return core.Decision{}, false, nil
}

// answer decides by the mode.
func (p *policy) answer(ctx context.Context, key string, n int64, b *breaker) (core.Decision, error) {
	s := p.s
	s.stats.fallbacks.Add(1)
	traceFallback(ctx, s.mode, b.degraded.Load())
	switch s.mode {
	case FailOpen:
		return core.Decision{Verdict: core.Verdict{Allowed: true, Remaining: p.quota}, Source: core.SourceFailOpen}, nil
	case FailClosed:
		us := s.interval.Microseconds()
		return core.Decision{Verdict: core.Verdict{Retry: us, Reset: us}, Source: core.SourceFailClosed}, nil
	}
	d, err := p.local.Take(ctx, key, n)
	d.Source = core.SourceLocal
	if err == nil && d.Allowed && n > 0 {
		p.record(key, n, b)
	}
	return d, err
}

// sync brings key's local share down to what the primary's Decision d
// says is left: it charges the local limiter what the primary admitted,
// and then whatever it holds beyond its share of the primary's remaining.
// Then a switch to local answers starts from the primary's state, not
// from a full bucket. It costs a memory-store decision or two per
// decision of the primary. It takes no context: the primary has charged
// by now, so a caller whose context ends as the answer comes back (an
// Envoy deadline, say) must not leave the local share unsynced, and the
// local store never waits.
func (p *policy) sync(key string, n int64, d *core.Decision) {
	ctx := context.Background()
	if p.local != nil {
		p.learn(ctx, key, d)
	}
	if p.local == nil || n == 0 {
		return
	}
	if !d.Allowed {
		n = 0
	}
	l, err := p.local.Charge(ctx, key, n)
	if err != nil {
		return
	}
	if target := d.Remaining / p.s.instances; l.Remaining > target {
		p.local.Charge(ctx, key, l.Remaining-target)
	}
}

// Refund implements core.Policy.Refund: it gives n back on the primary, and on
// the local limiter too (at most its share's quota). While the primary
// fails, only the local limiter gets it back; the primary keeps the
// charge, which errs toward denying.
func (p *policy) Refund(ctx context.Context, key string, n int64) (core.Decision, error) {
	if err := storekit.CheckRequest(key, n); err != nil {
		return core.Decision{}, err
	}
	s := p.s
	if s.closed.Load() {
		return core.Decision{}, floodgate.ErrClosed
	}
	pr, lr := p.primary, p.local
	b := s.breaker(key)
	d, done, err := p.primaryFirst(ctx, b, func(ctx context.Context) (core.Decision, error) {
		return pr.Refund(ctx, key, n)
	})
	if done {
		if err == nil && lr != nil {
			lr.Refund(ctx, key, n)
		}
		return d, err
	}
	if lr == nil {
		d, err := p.answer(ctx, key, 0, b)
		d.Allowed = true
		return d, err
	}
	s.stats.fallbacks.Add(1)
	d, err = lr.Refund(ctx, key, n)
	d.Source = core.SourceLocal
	return d, err
}

// Charge implements core.Policy.Charge: it charges the primary, and when the
// primary fails, the local limiter (recording the charge in the ledger,
// like a local admission), or nothing under FailOpen and FailClosed.
func (p *policy) Charge(ctx context.Context, key string, n int64) (core.Decision, error) {
	if err := storekit.CheckRequest(key, n); err != nil {
		return core.Decision{}, err
	}
	s := p.s
	if s.closed.Load() {
		return core.Decision{}, floodgate.ErrClosed
	}
	b := s.breaker(key)
	d, done, err := p.primaryFirst(ctx, b, func(ctx context.Context) (core.Decision, error) {
		return p.primary.Charge(ctx, key, n)
	})
	if done {
		if err == nil {
			p.sync(key, n, &d)
		}
		return d, err
	}
	if p.local == nil {
		d, err := p.answer(ctx, key, 0, b)
		d.Allowed = true
		return d, err
	}
	s.stats.fallbacks.Add(1)
	d, err = p.local.Charge(ctx, key, n)
	d.Source = core.SourceLocal
	if err == nil && n > 0 {
		p.record(key, n, b)
	}
	return d, err
}

// Reset implements core.Policy: it resets key in the local store and
// in the primary, and returns the primary's error, if any.
func (p *policy) Reset(ctx context.Context, key string) error {
	if err := storekit.CheckKey(key); err != nil {
		return err
	}
	s := p.s
	if s.closed.Load() {
		return floodgate.ErrClosed
	}
	if p.local != nil {
		if err := p.local.Reset(ctx, key); err != nil {
			return err
		}
	}
	_, err := s.breaker(key).call(ctx, func(ctx context.Context) (core.Decision, error) {
		return core.Decision{}, p.primary.Reset(ctx, key)
	})
	return err
}
