package floodgate

import (
	"context"
	"fmt"
	"hash/maphash"
	"sync"
	"sync/atomic"

	"github.com/floodgate/floodgate/core"
	"github.com/floodgate/floodgate/core/slot"

	"github.com/floodgate/floodgate/internal/lib/storekit"
)

// memSlots keeps the permits of the memory store's concurrency limits:
// one slot.State per key, in shards of their own (permits are few and
// short-lived, and share nothing with the rate limits' entries). A key
// that holds no live permit is dropped: by the operation that empties it,
// by the two keys of its shard and two of another, in turn, that each
// operation sweeps besides its own, or, when a shard
// is full, by a sweep of the whole shard; so the keys held are at most the
// live permits plus what those sweeps have not reached, and at most
// maxKeys per shard.
type memSlots struct {
	seed    maphash.Seed
	once    sync.Once
	maxKeys int
	turn    atomic.Uint64 // the shard the next call sweeps besides its own
	shards  [16]memSlotShard
}

type memSlotShard struct {
	mu   sync.Mutex
	keys map[string]slot.State
}

// memSlotPolicy applies one limit. The slots are the key's, whichever
// limit is applied to them, as a key's state is in every store: limits
// that must not share slots use different keys.
type memSlotPolicy struct {
	s    *MemoryStore
	spec slot.Spec
}

// PrepareSlots implements slot.Store.
func (s *MemoryStore) PrepareSlots(spec slot.Spec) (slot.Policy, error) {
	if err := spec.Validate(); err != nil {
		return nil, err
	}
	if s.closed.Load() {
		return nil, ErrClosed
	}
	s.slots.once.Do(func() { s.slots.seed = maphash.MakeSeed() })
	return &memSlotPolicy{s: s, spec: spec}, nil
}

// Slot implements slot.Policy.
func (p *memSlotPolicy) Slot(ctx context.Context, key string, op slot.Op) (slot.Verdict, core.Source, error) {
	if err := storekit.CheckSlotOp(key, op); err != nil {
		return slot.Verdict{}, 0, err
	}
	if p.s.closed.Load() {
		return slot.Verdict{}, 0, ErrClosed
	}
	if err := ctx.Err(); err != nil {
		return slot.Verdict{}, 0, err
	}
	ms := &p.s.slots
	k := key
	sh := &ms.shards[maphash.String(ms.seed, k)%uint64(len(ms.shards))]
	sh.mu.Lock()
	now := p.s.now()
	v, err := p.slotLocked(sh, key, op, now)
	sh.mu.Unlock()
	// Sweep a little of another shard, in turn, so that the keys of a
	// shard nobody calls on any more are dropped too.
	if o := &ms.shards[ms.turn.Add(1)%uint64(len(ms.shards))]; o != sh && o.mu.TryLock() {
		o.sweep(now, 2)
		o.mu.Unlock()
	}
	return v, core.SourceStore, err
}

func (p *memSlotPolicy) slotLocked(sh *memSlotShard, key string, op slot.Op, now int64) (slot.Verdict, error) {
	ms := &p.s.slots
	k := key
	st, ok := sh.keys[k]
	if !ok && op.Kind == slot.Acquire && len(sh.keys) >= ms.maxKeys {
		sh.sweep(now, -1)
		if len(sh.keys) >= ms.maxKeys {
			return slot.Verdict{}, fmt.Errorf("%w: the memory store holds %d keys with live permits in one shard, its most", ErrStore, len(sh.keys))
		}
	}
	next, v, err := p.spec.Step(st, now, op)
	if err != nil {
		return slot.Verdict{}, err
	}
	switch {
	case len(next.Permits) > 0:
		if sh.keys == nil {
			sh.keys = make(map[string]slot.State)
		}
		sh.keys[k] = next
	case ok:
		delete(sh.keys, k)
	}
	sh.sweep(now, 2)
	return v, nil
}

// sweep drops up to n keys (all, when n < 0) that hold no live permit.
// Go's maps start each range at a random place, so a few a call reach
// every key in time.
func (sh *memSlotShard) sweep(now int64, n int) {
	for k, st := range sh.keys {
		if n == 0 {
			return
		}
		n--
		if st.Live(now) == 0 {
			delete(sh.keys, k)
		}
	}
}

// slotKeys returns how many keys hold permits, live or not yet swept.
func (ms *memSlots) slotKeys() int {
	n := 0
	for i := range ms.shards {
		sh := &ms.shards[i]
		sh.mu.Lock()
		n += len(sh.keys)
		sh.mu.Unlock()
	}
	return n
}

var _ slot.Inspector = (*memSlotPolicy)(nil)

// InspectSlots implements slot.Inspector: it reads the key's permits
// under its shard's lock, and drops nothing.
func (p *memSlotPolicy) InspectSlots(ctx context.Context, key string) (slot.Inspection, error) {
	if err := storekit.CheckKey(key); err != nil {
		return slot.Inspection{}, err
	}
	if p.s.closed.Load() {
		return slot.Inspection{}, ErrClosed
	}
	if err := ctx.Err(); err != nil {
		return slot.Inspection{}, err
	}
	ms := &p.s.slots
	sh := &ms.shards[maphash.String(ms.seed, key)%uint64(len(ms.shards))]
	sh.mu.Lock()
	defer sh.mu.Unlock()
	in := sh.keys[key].InspectState(p.s.now())
	in.Source = core.SourceStore
	return in, nil
}
