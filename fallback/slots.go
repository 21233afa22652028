package fallback

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/floodgate/floodgate"
	"github.com/floodgate/floodgate/core"
	"github.com/floodgate/floodgate/core/slot"
	"github.com/floodgate/floodgate/internal/lib/storekit"
)

// Concurrency limits through the fallback. While the primary answers,
// every acquire, release and extend is the primary's. While it fails (its
// breaker is open, or a call fails within the budget), an acquire is
// answered by the mode: Local acquires on the local store, with the
// limit's share of Instances (slot.Spec.Share: N/Instances slots, at
// least 1); FailOpen grants a permit that the primary does not count;
// FailClosed denies, with the probe interval as RetryAfter.
//
// A permit granted locally stays the local store's until it is released
// or expires: release and extend look for the permit there first (a
// memory store call, which finds it or not exactly, since ids are
// random), and only then ask the primary. So when Redis comes back no
// permit is lost (its holder releases or extends it where it is), and
// none is counted twice (Redis never saw it). Redis does not see them
// either: while permits granted during the outage are held, a key may
// have up to N from Redis plus the local shares, N + Instances ×
// max(1, N/Instances) at most across Instances processes, which is about
// 2N; the local ones are gone at most a lease after Redis is back unless
// their holders extend them.
//
// A permit granted by FailOpen is remembered by the process that granted
// it (its key, id and expiry, up to maxOpenPermits: the oldest beyond are
// forgotten, and get the primary's answers) until it is released or
// expires, so that its holder is not told it lost a permit it was given.
// Its release answers released (the primary holds nothing to give back).
// Its extend while the primary fails renews it for a lease, as FailOpen
// grants; once the primary answers, its extend acquires it on the primary
// under its id, so that the primary counts it from then on and never
// holds more than N: when the primary has room, the permit is the
// primary's from then on; when the key is full there, the extend answers
// held with the permit's expiry unchanged, and tries again at the next
// extend, until that expiry, from which it answers not held. A stream
// admitted during the outage is so kept to the end of the lease it had
// when the primary came back, and no longer unless the primary counts it.
// The bound once the primary answers: a key has at most N permits that
// the primary counts, plus the fail-open ones it does not, which are
// gone at most a lease after the primary last failed a call on the key.
// Only the process that granted a fail-open permit knows it, as only the
// one that granted a local permit holds it: a release or extend sent to
// another process gets the primary's answer.
//
// An acquire that fails on the primary (a timeout on a hung server) may
// have been granted there all the same, when the server ran it after the
// caller gave up. Its permit id is kept (up to maxOrphans) and released
// on the primary once it answers again, so that such slots do not stay
// taken for a lease: each call to the primary first releases up to
// orphansPerCall of them, all at once, each within the budget, so that
// its caller waits for them one budget at most (and the Redis store
// carries operations made at once in shared script calls). An orphan
// whose release fails is kept for a later call. In FailOpen, the permit
// of such an acquire is the holder's: it is remembered as granted, not
// as an orphan, and its release hands it to the orphans. A release or
// extend that reaches the primary for an orphan (its holder's permit,
// granted locally or by FailOpen, has ended there) releases it there
// first and answers not held, so that a permit released is never held
// again, however many orphans wait.

type slotPolicy struct {
	s       *Store
	primary slot.Policy
	local   slot.Policy // nil unless the mode is Local
	spec    slot.Spec
	// orphans are the permits of acquires that failed on the primary (a
	// timeout, a hung server): the primary may have granted them all the
	// same, when it ran the call after the caller gave up. They are
	// released on the primary once it answers again, so that they do not
	// hold slots for a lease.
	orphanMu sync.Mutex
	orphans  []permitRef
	// orphaned counts each permit's entries in orphans, for claimOrphan.
	orphaned map[permitRef]int
	// open are the permits that FailOpen granted; nil in the other modes.
	open *openPermits
}

// permitRef names a permit: its key and its id.
type permitRef struct{ key, id string }

// maxOrphans bounds the permits kept for release after an outage; beyond
// it the oldest are forgotten, and free themselves at their lease's end.
const maxOrphans = 10000

// orphansPerCall is how many orphans one call releases, on its way, once
// the primary answers again; orphanScan is how many of the newest it
// looks at for them, passing over those whose own partition's breaker is
// open (a Redis Cluster master that is down), which wait for it.
const (
	orphansPerCall = 16
	orphanScan     = 4 * orphansPerCall
)

// PrepareSlots implements slot.Store: the primary's slots, and the
// local store's share of them in Local mode. Its errors wrap
// ErrInvalidLimit, also when the primary or the local store keeps no
// concurrency limits, or ErrClosed.
func (s *Store) PrepareSlots(spec slot.Spec) (slot.Policy, error) {
	if err := spec.Validate(); err != nil {
		return nil, err
	}
	if s.closed.Load() {
		return nil, floodgate.ErrClosed
	}
	ps, ok := s.primary.(slot.Store)
	if !ok {
		return nil, fmt.Errorf("%w: the primary store (%T) keeps no concurrency limits", floodgate.ErrInvalidLimit, s.primary)
	}
	p := &slotPolicy{s: s, spec: spec}
	if s.mode == FailOpen {
		p.open = newOpenPermits()
	}
	var err error
	if p.primary, err = ps.PrepareSlots(spec); err != nil {
		return nil, err
	}
	if s.mode == Local {
		ls, ok := s.local.(slot.Store)
		if !ok {
			return nil, fmt.Errorf("%w: the local store (%T) keeps no concurrency limits", floodgate.ErrInvalidLimit, s.local)
		}
		share, err := spec.Share(s.instances)
		if err != nil {
			return nil, err
		}
		if p.local, err = ls.PrepareSlots(share); err != nil {
			return nil, err
		}
	}
	return p, nil
}

// Slot implements slot.Policy. Its errors are as Policy.Take's: input
// errors, ErrClosed, the caller's context's, the primary's about key alone
// (ErrKey), and the local store's.
func (p *slotPolicy) Slot(ctx context.Context, key string, op slot.Op) (slot.Verdict, core.Source, error) {
	if err := storekit.CheckSlotOp(key, op); err != nil {
		return slot.Verdict{}, 0, err
	}
	s := p.s
	if s.closed.Load() {
		return slot.Verdict{}, 0, floodgate.ErrClosed
	}
	if op.Kind != slot.Acquire && p.local != nil {
		// A permit granted locally is given back or renewed there.
		v, _, err := p.local.Slot(ctx, key, op)
		if err != nil {
			return slot.Verdict{}, 0, err
		}
		if v.OK {
			return v, core.SourceLocal, nil
		}
	}
	if op.Kind != slot.Acquire && p.open != nil {
		if v, src, ok, err := p.failOpenOp(ctx, key, op); ok {
			return v, src, err
		}
	}
	b := s.breaker(key)
	tried := false // the primary was called, and failed
	if !b.degraded.Load() {
		// An orphan's release or extend: its permit ended where it was
		// granted, and its copy on the primary is released, not held,
		// even while more orphans wait than a call releases.
		claimed := op.Kind != slot.Acquire && p.claimOrphan(key, op.ID)
		callOp := op
		if claimed {
			callOp.Kind = slot.Release
		}
		v, err := p.call(ctx, b, key, callOp)
		if err != nil && (claimed || op.Kind == slot.Acquire && p.open == nil) && !storekit.IsInvalidInput(err) && !errors.Is(err, floodgate.ErrKey) {
			p.orphan(key, op.ID)
		}
		switch {
		case err == nil && claimed:
			return slot.Verdict{Held: v.Held}, core.SourceStore, nil
		case err == nil:
			return v, core.SourceStore, nil
		case ctx.Err() != nil:
			return slot.Verdict{}, 0, ctx.Err()
		case storekit.IsInvalidInput(err):
			return slot.Verdict{}, 0, err
		case errors.Is(err, floodgate.ErrKey):
			s.stats.keyErrors.Add(1)
			return slot.Verdict{}, 0, err
		}
		b.failed(err)
		if op.Kind != slot.Acquire {
			return slot.Verdict{}, 0, fmt.Errorf("%w: fallback: the primary store failed to %s the permit, which only it holds: %w", floodgate.ErrStore, opVerb(op.Kind), err)
		}
		tried = true
	} else if op.Kind != slot.Acquire {
		// The local store does not hold the permit, and the primary, which
		// does, cannot be asked: a store failure, not "not held", so that a
		// holder extending it tries again rather than giving up its work.
		// Left alone, the primary's permit expires after its lease.
		return slot.Verdict{}, 0, fmt.Errorf("%w: fallback: the primary store is failing; the permit, which only it holds, cannot be %s until it recovers", floodgate.ErrStore, opPast(op.Kind))
	}
	s.stats.fallbacks.Add(1)
	now := s.clock.Now().UnixMicro()
	switch s.mode {
	case FailOpen:
		// An acquire that failed on the primary may have been granted
		// there after all (tried): the permit's release then releases it
		// there too.
		p.open.put(key, op.ID, now, now+p.spec.Lease, tried)
		return slot.Verdict{OK: true, Expiry: now + p.spec.Lease}, core.SourceFailOpen, nil
	case FailClosed:
		return slot.Verdict{Held: p.spec.Slots, Retry: s.interval.Microseconds()}, core.SourceFailClosed, nil
	}
	v, _, err := p.local.Slot(ctx, key, op)
	return v, core.SourceLocal, err
}

// failOpenOp releases or extends a permit that FailOpen granted, as the
// file's comment says; ok is false when op's permit is not one (or has
// been forgotten), for the primary to answer.
func (p *slotPolicy) failOpenOp(ctx context.Context, key string, op slot.Op) (slot.Verdict, core.Source, bool, error) {
	s := p.s
	now := s.clock.Now().UnixMicro()
	fo, found := p.open.get(key, op.ID)
	switch {
	case !found:
		return slot.Verdict{}, 0, false, nil
	case fo.expiry <= now:
		// Expired, as a store's permit expires: not held.
		p.open.drop(key, op.ID)
		return slot.Verdict{}, core.SourceFailOpen, true, nil
	case op.Kind == slot.Release:
		p.open.drop(key, op.ID)
		if fo.maybe {
			p.orphan(key, op.ID)
		}
		return slot.Verdict{OK: true}, core.SourceFailOpen, true, nil
	}
	maybe := fo.maybe
	if b := s.breaker(key); !b.degraded.Load() {
		v, err := p.call(ctx, b, key, slot.Op{Kind: slot.Acquire, ID: op.ID})
		if errors.Is(err, slot.ErrInvalidPermit) {
			// Held there already: the acquire that failed on the primary
			// ran after all. Its lease there is renewed instead.
			v, err = p.call(ctx, b, key, op)
		}
		switch {
		case err == nil && v.OK:
			p.open.drop(key, op.ID)
			return v, core.SourceStore, true, nil
		case err == nil:
			// The key is full on the primary: the permit keeps the lease
			// it was given, and no more.
			s.stats.fallbacks.Add(1)
			return slot.Verdict{OK: true, Held: v.Held, Expiry: fo.expiry}, core.SourceFailOpen, true, nil
		case ctx.Err() != nil:
			return slot.Verdict{}, 0, true, ctx.Err()
		case storekit.IsInvalidInput(err):
			return slot.Verdict{}, 0, true, err
		case errors.Is(err, floodgate.ErrKey):
			s.stats.keyErrors.Add(1)
			return slot.Verdict{}, 0, true, err
		}
		b.failed(err)
		maybe = true
	}
	// The primary fails: FailOpen renews what it granted, as it grants.
	s.stats.fallbacks.Add(1)
	exp := max(fo.expiry, now+p.spec.Lease)
	p.open.put(key, op.ID, now, exp, maybe)
	return slot.Verdict{OK: true, Expiry: exp}, core.SourceFailOpen, true, nil
}

// orphan remembers the permit of an acquire that failed on the primary.
func (p *slotPolicy) orphan(key, id string) {
	p.orphanMu.Lock()
	if len(p.orphans) >= maxOrphans {
		p.unorphan(p.orphans[0])
		p.orphans = append(p.orphans[:0], p.orphans[1:]...)
	}
	ref := permitRef{key, id}
	p.orphans = append(p.orphans, ref)
	if p.orphaned == nil {
		p.orphaned = make(map[permitRef]int)
	}
	p.orphaned[ref]++
	p.orphanMu.Unlock()
}

// unorphan uncounts one entry of ref; p.orphanMu is held.
func (p *slotPolicy) unorphan(ref permitRef) {
	if p.orphaned[ref]--; p.orphaned[ref] <= 0 {
		delete(p.orphaned, ref)
	}
}

// claimOrphan takes the permit id on key out of the orphans, if it is
// one, and reports whether it was. A release or extend of an orphan comes
// from a holder whose permit was granted elsewhere (the local store, or
// FailOpen) and has ended there: the primary's copy, if it has one, is
// no permit of the holder's, and must not answer held.
func (p *slotPolicy) claimOrphan(key, id string) bool {
	ref := permitRef{key, id}
	p.orphanMu.Lock()
	defer p.orphanMu.Unlock()
	if p.orphaned[ref] == 0 {
		return false
	}
	delete(p.orphaned, ref)
	p.orphans = slices.DeleteFunc(p.orphans, func(o permitRef) bool { return o == ref })
	return true
}

// takeOrphans takes up to orphansPerCall orphans to release, among the
// orphanScan newest, whose partitions' breakers are closed.
func (p *slotPolicy) takeOrphans() []permitRef {
	p.orphanMu.Lock()
	defer p.orphanMu.Unlock()
	n := len(p.orphans)
	if n == 0 {
		return nil
	}
	var batch []permitRef
	kept := max(0, n-orphanScan)
	for _, o := range p.orphans[kept:] {
		if len(batch) < orphansPerCall && !p.s.breaker(o.key).degraded.Load() {
			batch = append(batch, o)
			p.unorphan(o)
			continue
		}
		p.orphans[kept] = o
		kept++
	}
	clear(p.orphans[kept:])
	p.orphans = p.orphans[:kept]
	return batch
}

// releaseOrphan releases o on the primary, within the budget; it is kept
// for a later call when that fails.
func (p *slotPolicy) releaseOrphan(ctx context.Context, o permitRef) {
	_, err := p.callOne(ctx, p.s.breaker(o.key), o.key, slot.Op{Kind: slot.Release, ID: o.id})
	if err != nil && !storekit.IsInvalidInput(err) && !errors.Is(err, floodgate.ErrKey) {
		p.orphan(o.key, o.id)
	}
}

// call applies op on the primary (callOne), after releasing orphans
// there, each in a goroutine of its own that call waits for: a caller
// waits for them a budget at most, however many there are, and its own
// op sees the slots they free.
func (p *slotPolicy) call(ctx context.Context, b *breaker, key string, op slot.Op) (slot.Verdict, error) {
	if batch := p.takeOrphans(); len(batch) > 0 {
		var wg sync.WaitGroup
		for _, o := range batch {
			wg.Add(1)
			go func() {
				defer wg.Done()
				// The caller's own context may end; the orphan's slot must come back.
				p.releaseOrphan(context.WithoutCancel(ctx), o)
			}()
		}
		wg.Wait()
	}
	return p.callOne(ctx, b, key, op)
}

// callOne is breaker.call for a slot operation: within the budget,
// counting a success.
func (p *slotPolicy) callOne(ctx context.Context, b *breaker, key string, op slot.Op) (slot.Verdict, error) {
	cctx, cancel := ctx, context.CancelFunc(nil)
	if b.s.budget > 0 {
		if dl, ok := ctx.Deadline(); !ok || time.Until(dl) > b.s.budget {
			cctx, cancel = context.WithTimeout(ctx, b.s.budget)
		}
	}
	v, _, err := p.primary.Slot(cctx, key, op)
	if cancel != nil {
		cancel()
	}
	if err == nil && b.fails.Load() != 0 {
		b.fails.Store(0)
	}
	return v, err
}

// opVerb and opPast name a release or an extend in errors.
func opVerb(k slot.OpKind) string {
	if k == slot.Release {
		return "release"
	}
	return "extend"
}

func opPast(k slot.OpKind) string {
	if k == slot.Release {
		return "released"
	}
	return "extended"
}

var _ slot.Inspector = (*slotPolicy)(nil)

// InspectSlots implements slot.Inspector: the primary's slots of key
// while its breaker is closed and it answers within the budget, else the
// mode's (the local store's in Local mode; none held in FailOpen, whose
// acquires are granted whatever it remembers; all in FailClosed); and
// beside them, as Fallback.Local, the permits of the key that the
// primary does not count: in Local mode the local store's, held until
// released or expired whoever answers; in FailOpen those it granted and
// remembers (Source SourceFailOpen), held until released, expired, or
// moved onto the primary by an extend. A primary or local store that
// cannot inspect gives an error wrapping errors.ErrUnsupported.
func (p *slotPolicy) InspectSlots(ctx context.Context, key string) (slot.Inspection, error) {
	if err := storekit.CheckKey(key); err != nil {
		return slot.Inspection{}, err
	}
	s := p.s
	if s.closed.Load() {
		return slot.Inspection{}, floodgate.ErrClosed
	}
	fb := &slot.FallbackInspection{Mode: s.mode.String(), Instances: s.instances}
	if p.local != nil {
		li, ok := p.local.(slot.Inspector)
		if !ok {
			return slot.Inspection{}, fmt.Errorf("fallback: the local store cannot inspect a key's slots: %w", errors.ErrUnsupported)
		}
		local, err := li.InspectSlots(ctx, key)
		if err != nil {
			return slot.Inspection{}, err
		}
		local.Source = core.SourceLocal
		fb.Local = &local
	}
	if p.open != nil {
		// As the local store's permits are reported in Local mode: those
		// this process granted, which the primary does not count.
		now := s.clock.Now().UnixMicro()
		open := slot.Inspection{Now: now, Source: core.SourceFailOpen}
		open.Held, open.Earliest = p.open.inspect(key, now)
		fb.Local = &open
	}
	b := s.breaker(key)
	if !b.degraded.Load() {
		pi, ok := p.primary.(slot.Inspector)
		if !ok {
			return slot.Inspection{}, fmt.Errorf("fallback: the primary store cannot inspect a key's slots: %w", errors.ErrUnsupported)
		}
		cctx, cancel := ctx, context.CancelFunc(nil)
		if s.budget > 0 {
			if dl, ok := ctx.Deadline(); !ok || time.Until(dl) > s.budget {
				cctx, cancel = context.WithTimeout(ctx, s.budget)
			}
		}
		in, err := pi.InspectSlots(cctx, key)
		if cancel != nil {
			cancel()
		}
		switch {
		case err == nil:
			in.Fallback = fb
			return in, nil
		case ctx.Err() != nil:
			return slot.Inspection{}, ctx.Err()
		case storekit.IsInvalidInput(err), errors.Is(err, floodgate.ErrKey):
			return slot.Inspection{}, err
		}
		// A look that fails does not count against the breaker: it
		// decides nothing.
	}
	fb.Degraded = true
	now := s.clock.Now().UnixMicro()
	var in slot.Inspection
	switch s.mode {
	case FailOpen:
		in = slot.Inspection{Now: now, Source: core.SourceFailOpen}
	case FailClosed:
		in = slot.Inspection{Now: now, Held: p.spec.Slots, Earliest: now + s.interval.Microseconds(), Source: core.SourceFailClosed}
	default:
		in = *fb.Local
	}
	in.Fallback = fb
	return in, nil
}
