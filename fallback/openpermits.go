package fallback

import (
	"container/list"
	"sync"
)

// maxOpenPermits bounds the permits that FailOpen granted and a policy
// remembers; beyond it the oldest are forgotten, and the primary answers
// for them (not held, once it answers).
const maxOpenPermits = 10000

// openPermits are the permits that FailOpen granted on a policy's keys and
// that are neither released nor moved onto the primary: a list in the
// order they were granted or renewed, which is their expiries' order
// unless the clock steps back, for dropping the oldest, and a map for
// finding one.
type openPermits struct {
	mu    sync.Mutex
	byRef map[permitRef]*list.Element
	order list.List // of *openPermit, by when each was granted or renewed
}

// openPermit is one permit that FailOpen granted.
type openPermit struct {
	ref    permitRef
	expiry int64 // µs since the epoch, on the Store's clock
	// maybe says that the primary may hold the permit too: its acquire
	// failed there, perhaps after the primary ran it.
	maybe bool
}

func newOpenPermits() *openPermits {
	return &openPermits{byRef: make(map[permitRef]*list.Element)}
}

// get returns the permit id on key, if it is remembered.
func (o *openPermits) get(key, id string) (openPermit, bool) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if e, ok := o.byRef[permitRef{key, id}]; ok {
		return *e.Value.(*openPermit), true
	}
	return openPermit{}, false
}

// put remembers the permit id on key, granted or renewed at now to expire
// at expiry, as the newest; it drops the permits expired at now from the
// oldest on, and the oldest beyond maxOpenPermits.
func (o *openPermits) put(key, id string, now, expiry int64, maybe bool) {
	ref := permitRef{key, id}
	o.mu.Lock()
	defer o.mu.Unlock()
	o.remove(ref)
	for e := o.order.Front(); e != nil; e = o.order.Front() {
		op := e.Value.(*openPermit)
		if op.expiry > now && len(o.byRef) < maxOpenPermits {
			break
		}
		o.remove(op.ref)
	}
	o.byRef[ref] = o.order.PushBack(&openPermit{ref: ref, expiry: expiry, maybe: maybe})
}

// inspect reports the permits remembered on key that are live at now:
// how many, and the earliest expiry among them (0 when none is). It reads
// every remembered permit, which is bounded; it serves an inspection, not
// a decision.
func (o *openPermits) inspect(key string, now int64) (held, earliest int64) {
	o.mu.Lock()
	defer o.mu.Unlock()
	for e := o.order.Front(); e != nil; e = e.Next() {
		op := e.Value.(*openPermit)
		if op.ref.key != key || op.expiry <= now {
			continue
		}
		held++
		if earliest == 0 || op.expiry < earliest {
			earliest = op.expiry
		}
	}
	return held, earliest
}

// drop forgets the permit id on key.
func (o *openPermits) drop(key, id string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.remove(permitRef{key, id})
}

// remove forgets ref; o.mu is held.
func (o *openPermits) remove(ref permitRef) {
	if e, ok := o.byRef[ref]; ok {
		o.order.Remove(e)
		delete(o.byRef, ref)
	}
}
