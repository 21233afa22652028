package floodgate

import (
	"context"
	"slices"
	"strings"
	"time"

	"github.com/floodgate/floodgate/core"

	"github.com/floodgate/floodgate/internal/lib/arith"
	"github.com/floodgate/floodgate/internal/lib/storekit"
)

// This file is the memory store's per-key overrides. An override lives in
// its key's shard, under the shard's lock, so that a decision and a change
// of limits are one after the other, never interleaved.

// memOverride is one key's override: its limits, prepared, and when it
// expires (µs on the store's clock; 0 never).
type memOverride struct {
	pol     *memPolicy
	expires int64
}

// override returns key's override in sh, which is locked, or nil; an
// expired one is removed.
func (sh *memShard) override(key string, now int64) *memOverride {
	ov := sh.ovr[key]
	if ov != nil && ov.expires != 0 && ov.expires <= now {
		sh.dropOverride(key)
		return nil
	}
	return ov
}

func (sh *memShard) dropOverride(key string) {
	delete(sh.ovr, key)
	if len(sh.ovr) == 0 && sh.ovr != nil {
		sh.ovr = nil
		sh.slow.Add(-1)
	}
}

var _ core.Policy = (*memPolicy)(nil)

// SetOverride implements core.Policy.
func (p *memPolicy) SetOverride(ctx context.Context, key string, o *core.Override, st core.Strategy) error {
	if err := storekit.CheckOverride(key, o, st); err != nil {
		return err
	}
	s := p.s
	if s.closed.Load() {
		return ErrClosed
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	var ov *memOverride
	if o != nil {
		ov = &memOverride{pol: &memPolicy{s: s, specs: slices.Clone(o.Limits)}}
	}
	h, sh := s.locate(key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	sh.slow.Add(1) // no decision in the middle of the change
	defer sh.slow.Add(-1)
	now := s.now()
	from := p.specs
	if old := sh.override(key, now); old != nil {
		from = old.pol.specs
	}
	to := p.specs
	if ov != nil {
		to = ov.pol.specs
		if o.TTL > 0 {
			ov.expires = now + o.TTL.Microseconds()
		}
		if sh.ovr == nil {
			sh.ovr = make(map[string]*memOverride)
			sh.slow.Add(1)
		}
		sh.ovr[key] = ov
	} else {
		sh.dropOverride(key)
	}
	s.carryLocked(sh, h, key, from, to, st, now)
	return nil
}

// carryLocked moves key's usage (its hash is h) in sh, which is locked
// with its slow count raised, from the limits from to the limits to, as st
// says (see storekit.Carry).
func (s *MemoryStore) carryLocked(sh *memShard, h uint64, key string, from, to []core.Spec, st core.Strategy, now int64) {
	e := sh.get(h, key, s.bytesShard)
	if st == core.ResetUsage {
		if e != nil {
			sh.remove(e, now, false)
		}
		return
	}
	if e != nil {
		e.quiet()
	}
	// state returns key's state for limit l at index i, or a full one.
	var zero core.State
	state := func(l *core.Spec, i int) *core.State {
		if e != nil && i < len(e.states) && e.states[i].Kind == l.Kind {
			return &e.states[i]
		}
		zero = core.State{}
		return &zero
	}
	var want [MaxLimits]int64
	// stateTo is state for the new limits: a window of another shape
	// reads as full, as the loop below starts it afresh.
	stateTo := func(l *core.Spec, i int) *core.State {
		if i < len(from) && !sameShape(&from[i], l) {
			zero = core.State{}
			return &zero
		}
		return state(l, i)
	}
	carried := false
	for i := range to {
		want[i] = -1 // a new limit starts full
		if i < len(from) {
			vf, _ := from[i].Step(state(&from[i], i), now, 0)
			want[i] = storekit.Carry(st, from[i].Quota, vf.Remaining, to[i].Quota)
			vt, _ := to[i].Step(stateTo(&to[i], i), now, 0)
			carried = carried || vt.Remaining != want[i]
		}
	}
	if e == nil && !carried {
		return
	}
	isNew := e == nil
	if isNew {
		e = newEntry(len(to), h)
	} else if len(e.states) != len(to) {
		e.resize(len(to))
	}
	var full int64
	for i := range to {
		l, st := &to[i], &e.states[i]
		if st.Kind != l.Kind || (i < len(from) && !sameShape(&from[i], l)) {
			clear(st.Log)
			*st = core.State{Log: st.Log[:0]}
		}
		v, d := l.Step(st, now, 0)
		if l.Kind == core.Log {
			// Reading a sliding log drops its expired marks (all of them
			// when it rejoins the clock), as the Redis store's peek does;
			// a peek's grown skew is not kept.
			skew := st.Skew
			l.Commit(st, d, now, 0, false)
			if len(st.Log) > 0 {
				st.Skew = skew
			}
			v, d = l.Step(st, now, 0)
		}
		if w := want[i]; w >= 0 && v.Remaining != w {
			if v.Remaining < w {
				_, d = l.Refund(st, now, w-v.Remaining)
				l.Commit(st, d, now, v.Remaining-w, true)
				v, d = l.Step(st, now, 0)
			}
			if v.Remaining != w {
				// Charge what is above the target, from a fresh state if a
				// refund fell short.
				if v.Remaining < w {
					clear(st.Log)
					*st = core.State{Log: st.Log[:0]}
					v.Remaining = l.Quota
				}
				if n := v.Remaining - w; n > 0 {
					_, d = l.Charge(st, now, n)
					l.Commit(st, d, now, n, true)
				}
				v, d = l.Step(st, now, 0)
			}
		}
		full = max(full, l.Hold(v, d, now))
	}
	e.full = now + full
	s.account(sh, key, e, isNew, !isNew, now)
}

// GetOverride implements core.Policy.
func (p *memPolicy) GetOverride(ctx context.Context, key string) (core.Override, bool, error) {
	if err := storekit.CheckKey(key); err != nil {
		return core.Override{}, false, err
	}
	s := p.s
	if s.closed.Load() {
		return core.Override{}, false, ErrClosed
	}
	sh := s.shard(key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	now := s.now()
	ov := sh.override(key, now)
	if ov == nil {
		return core.Override{}, false, nil
	}
	return ov.export(now), true, nil
}

// export returns the override as core.Override, with the time it has left
// at now, rounded up to the millisecond.
func (ov *memOverride) export(now int64) core.Override {
	o := core.Override{Limits: slices.Clone(ov.pol.specs)}
	if ov.expires != 0 {
		o.TTL = time.Duration(arith.RoundUp(time.Duration(ov.expires-now)*time.Microsecond, time.Millisecond)) * time.Millisecond
	}
	return o
}

// ListOverrides implements core.Policy.
func (p *memPolicy) ListOverrides(ctx context.Context, fn func(key string, o core.Override) bool) error {
	s := p.s
	for i := range s.shards {
		if s.closed.Load() {
			return ErrClosed
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		type kv struct {
			key string
			o   core.Override
		}
		var found []kv
		sh := &s.shards[i]
		sh.mu.Lock()
		now := s.now()
		for key := range sh.ovr {
			if ov := sh.override(key, now); ov != nil {
				found = append(found, kv{key, ov.export(now)})
			}
		}
		sh.mu.Unlock()
		for _, f := range found {
			if !fn(f.key, f.o) {
				return nil
			}
		}
	}
	return nil
}

// sameShape reports whether a window limit's state carries over from
// from to to as it stands: the same kind of window over the same period,
// both calendar or both epoch-aligned. A window of another shape starts
// afresh and is charged what the strategy keeps, since its counts were
// kept in windows that to does not have. Buckets always carry over (a
// refund that falls short starts them afresh; see storekit.Carry).
func sameShape(from, to *core.Spec) bool {
	if to.Kind == core.Bucket {
		return true
	}
	return from.Kind == to.Kind && from.Period == to.Period && from.Calendar == to.Calendar && from.Location == to.Location
}

// Rebase implements core.Policy.Rebase. The limits recorded per scope live in
// the store, so a Limiter built again on the same store with other limits
// finds the old ones.
func (p *memPolicy) Rebase(ctx context.Context, scope string, st core.Strategy) (int, error) {
	if err := storekit.CheckRebase(scope, st); err != nil {
		return 0, err
	}
	s := p.s
	if s.closed.Load() {
		return 0, ErrClosed
	}
	s.rebaseMu.Lock()
	from, seen := s.rebased[scope]
	if s.rebased == nil {
		s.rebased = make(map[string][]core.Spec)
	}
	s.rebased[scope] = p.specs
	s.rebaseMu.Unlock()
	if !seen || !storekit.Rebasable(from, p.specs) {
		return 0, nil
	}
	carried := 0
	var keys []*memEntry
	for i := range s.shards {
		if err := ctx.Err(); err != nil {
			return carried, err
		}
		sh := &s.shards[i]
		sh.mu.Lock()
		now := s.now()
		keys = keys[:0]
		sh.idx.all(func(e *memEntry) {
			if strings.HasPrefix(e.key, scope) && sh.override(e.key, now) == nil {
				keys = append(keys, e)
			}
		})
		sh.slow.Add(1) // no decision in the middle of a change
		for _, e := range keys {
			s.carryLocked(sh, e.hash, e.key, from, p.specs, st, now)
		}
		sh.slow.Add(-1)
		sh.mu.Unlock()
		carried += len(keys)
	}
	return carried, nil
}
