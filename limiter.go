package floodgate

import (
	"context"
	"fmt"
	"slices"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/floodgate/floodgate/core"

	"github.com/floodgate/floodgate/internal/lib/slicepool"
	"github.com/floodgate/floodgate/internal/lib/storekit"
)

// Limiter applies a fixed set of limits to keys, over a Store.
//
// A Limiter is safe for concurrent use. Its methods that talk to the store
// take a context first and return the store's errors; a denied request is
// reported by Result.Allowed, never as an error.
type Limiter struct {
	limits []Limit
	specs  []core.Spec
	policy core.Policy
	mem    *memPolicy // policy, when it is the memory store's: called directly
	tr     *tracing   // nil: not traced (Options.TracerProvider); beside mem, which AllowN reads too
	store  Store      // closed by Close when owned
	owned  bool
	clock  Clock
	// groups holds AllowGroup's requests to the store, for groups whose
	// first request is this Limiter's.
	groups slicepool.Pool[core.Request]
}

// Options configures a Limiter. The zero value (or nil) gives the
// defaults. (Every package is configured this way; the package
// documentation says why.)
type Options struct {
	// Clock is what WaitN reads the time from and sleeps on. Give the
	// store the same clock in tests. Default: SystemClock().
	Clock Clock
	// TracerProvider, when set, traces the Limiter's calls with
	// OpenTelemetry: each decision is a span (SpanCheck, SpanCharge,
	// SpanRefund, SpanReset, SpanGroup), a child of the span in the
	// call's context, with its outcome, the limit that decided, the
	// source and whether the key is overridden (the Attr constants).
	// A store that talks to a server adds a span of its own under it
	// while it is recording (redisstore's, with its script calls and
	// batch). Any TracerProvider does; its sampler decides which calls
	// are recorded. Default: nil, nothing is traced, and a decision
	// costs no allocation and no time more.
	TracerProvider trace.TracerProvider
	// TraceAttributes are added to every span of the Limiter: what the
	// Limiter is for, such as the name of a rule
	// (attribute.NewSet(attribute.String("rule", "api"))). A Set, so
	// that Options stays comparable. Default: none.
	TraceAttributes attribute.Set
	// TraceKeys records each call's key in its span (AttrKey). Keys can
	// be personal data (a user's id, an address), so by default they
	// are not recorded.
	TraceKeys bool
}

// New returns a Limiter that applies limits over a new in-memory store
// with the default configuration, which Close closes. It returns an error
// wrapping ErrInvalidLimit or ErrNoLimits if the limits are not usable.
//
// Several limits are checked as one: New(PerSecond(10), PerHour(1000)).
func New(limits ...Limit) (*Limiter, error) {
	if _, err := compile(limits); err != nil {
		return nil, err
	}
	st := NewMemoryStore(nil)
	l, err := NewLimiter(st, limits, nil)
	if err != nil {
		st.Close()
		return nil, err
	}
	l.owned = true
	return l, nil
}

// NewLimiter returns a Limiter that applies limits over store: it
// validates the limits and has the store prepare them, once. Closing the
// Limiter does not close store, which may be shared by several Limiters.
func NewLimiter(store Store, limits []Limit, opts *Options) (*Limiter, error) {
	if store == nil {
		return nil, fmt.Errorf("floodgate: NewLimiter needs a store")
	}
	specs, err := compile(limits)
	if err != nil {
		return nil, err
	}
	p, err := store.Prepare(specs)
	if err != nil {
		return nil, err
	}
	l := &Limiter{limits: slices.Clone(limits), specs: specs, policy: p, store: store}
	l.mem, _ = p.(*memPolicy)
	if opts != nil {
		l.clock = opts.Clock
	}
	if l.clock == nil {
		l.clock = SystemClock()
	}
	if l.tr = newTracing(opts); l.tr != nil {
		// The same Limiter untraced, which the traced calls decide with,
		// so that an untraced decision is one comparison longer, rather
		// than a call deeper.
		l.tr.plain = &Limiter{limits: l.limits, specs: specs, policy: p, mem: l.mem, store: store, clock: l.clock}
	}
	return l, nil
}

// compile validates limits and returns their compiled forms.
func compile(limits []Limit) ([]core.Spec, error) {
	if len(limits) == 0 || len(limits) > MaxLimits {
		return nil, storekit.CheckSpecs(make([]core.Spec, len(limits))) // says how many are allowed
	}
	specs := make([]core.Spec, len(limits))
	for i, l := range limits {
		if err := l.Validate(); err != nil {
			if len(limits) > 1 {
				return nil, fmt.Errorf("limit %d: %w", i, err)
			}
			return nil, err
		}
		specs[i] = l.spec
	}
	if err := storekit.CheckSpecs(specs); err != nil {
		return nil, err
	}
	return specs, nil
}

// Limits returns a copy of the limits the Limiter applies.
func (l *Limiter) Limits() []Limit { return slices.Clone(l.limits) }

// Allow is AllowN(ctx, key, 1).
func (l *Limiter) Allow(ctx context.Context, key string) (Result, error) {
	return l.AllowN(ctx, key, 1)
}

// AllowN decides whether a request of cost n on key passes every limit,
// and charges them all if it does. n = 0 peeks: the Result reports the
// key's state and nothing changes. A cost larger than a limit's Quota is
// denied with RetryAfter Never.
func (l *Limiter) AllowN(ctx context.Context, key string, n int64) (r Result, err error) {
	if l.tr != nil {
		return l.allowTraced(ctx, key, n)
	}
	if l.mem != nil {
		v, i, derr := l.mem.decide(ctx, key, n, opTake)
		if derr == nil {
			fillVerdict(&r, &l.specs[i], &v, i) // in place (see fillVerdict)
			return r, nil
		}
		if derr != errOverridden {
			return Result{}, derr
		}
		d := l.mem.takeOverridden(key, n, opTake)
		return result(l.specs, &d), nil
	}
	d, err := l.policy.Take(ctx, key, n)
	if err != nil {
		return Result{}, err
	}
	return result(l.specs, &d), nil
}

// Charge charges n on key against every limit whatever they say: a cost
// that is known only after the fact, or was admitted elsewhere. It may
// take the key into debt, so that later requests wait until it is repaid;
// one Charge takes at most each limit's Quota. The Result is allowed and
// reports the state after the charge.
func (l *Limiter) Charge(ctx context.Context, key string, n int64) (Result, error) {
	if l.tr != nil {
		return l.decideTraced(ctx, SpanCharge, key, n, l.policy.Charge)
	}
	d, err := l.policy.Charge(ctx, key, n)
	if err != nil {
		return Result{}, err
	}
	return result(l.specs, &d), nil
}

// Refund gives n units back to key on every limit: a request that was
// charged and failed, or a cost estimated too high. It is exact and never
// takes a limit beyond its Quota: a key that is full stays full (see
// core.Spec.Refund for each algorithm). The Result is allowed and reports
// the state after the refund.
func (l *Limiter) Refund(ctx context.Context, key string, n int64) (Result, error) {
	if l.tr != nil {
		return l.decideTraced(ctx, SpanRefund, key, n, l.policy.Refund)
	}
	d, err := l.policy.Refund(ctx, key, n)
	if err != nil {
		return Result{}, err
	}
	return result(l.specs, &d), nil
}

// MaxSettleQuotas bounds the debt that one Settle charges: at most this
// many times the smallest of the Limiter's quotas.
const MaxSettleQuotas = 16

// Settle corrects a charge made before the cost was known: a request was
// charged an estimate (AllowN with charged), and it really cost cost. The
// difference is refunded (Refund) or charged (Charge), so that the key
// ends as if cost had been charged in the first place. A charge larger
// than a quota goes in quota-sized charges, up to MaxSettleQuotas quotas
// of debt; more is not charged. The Result reports the state after.
// charged and cost must not be negative (ErrInvalidCost).
func (l *Limiter) Settle(ctx context.Context, key string, charged, cost int64) (Result, error) {
	if err := storekit.CheckCost(charged); err != nil {
		return Result{}, err
	}
	if err := storekit.CheckCost(cost); err != nil {
		return Result{}, err
	}
	switch {
	case cost < charged:
		return l.Refund(ctx, key, charged-cost)
	case cost == charged:
		return l.Peek(ctx, key)
	}
	quota := l.limits[0].Quota()
	for _, lim := range l.limits[1:] {
		quota = min(quota, lim.Quota())
	}
	var res Result
	var err error
	for left, i := cost-charged, 0; left > 0 && i < MaxSettleQuotas; i++ {
		chunk := min(left, quota)
		if res, err = l.Charge(ctx, key, chunk); err != nil {
			return Result{}, err
		}
		left -= chunk
	}
	return res, nil
}

// Peek is AllowN(ctx, key, 0): the key's state, without changing it.
func (l *Limiter) Peek(ctx context.Context, key string) (Result, error) {
	return l.AllowN(ctx, key, 0)
}

// Reset makes key full again on every limit.
func (l *Limiter) Reset(ctx context.Context, key string) error {
	if l.tr != nil {
		return l.resetTraced(ctx, key)
	}
	return l.policy.Reset(ctx, key)
}

// Wait is WaitN(ctx, key, 1).
func (l *Limiter) Wait(ctx context.Context, key string) error {
	return l.WaitN(ctx, key, 1)
}

// WaitN blocks until a request of cost n on key is allowed (and charged),
// or ctx is done. It returns at once, without waiting, an error wrapping
// ErrCostTooHigh when n is larger than a limit's Quota, and one wrapping
// ErrDeadline when ctx's deadline comes before the request could pass.
//
// WaitN sleeps for the RetryAfter that each denial reports, then tries
// again. Waiters are not queued: when several wait on one key, the first
// to try after capacity returns gets it.
func (l *Limiter) WaitN(ctx context.Context, key string, n int64) error {
	for {
		if err := ctx.Err(); err != nil {
			return err
		}
		r, err := l.AllowN(ctx, key, n)
		if err != nil {
			return err
		}
		if r.Allowed {
			return nil
		}
		if r.RetryAfter == Never {
			return fmt.Errorf("%w: cost %d, limit %d is %s", ErrCostTooHigh, n, r.Index, l.limits[r.Index])
		}
		if dl, ok := ctx.Deadline(); ok && l.clock.Now().Add(r.RetryAfter).After(dl) {
			return fmt.Errorf("%w: allowed in %s", ErrDeadline, r.RetryAfter)
		}
		if err := l.clock.Sleep(ctx, r.RetryAfter); err != nil {
			return err
		}
	}
}

// Close closes the store if New made it, and does nothing otherwise. It is
// safe to call more than once.
func (l *Limiter) Close() error {
	if l.owned {
		return l.store.Close()
	}
	return nil
}
