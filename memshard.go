package floodgate

import (
	"sync"
	"sync/atomic"
	"unsafe"

	"github.com/floodgate/floodgate/core"
)

// This file is the memory store's shard: a map of keys, bounded in keys
// and in bytes, with eviction that is fair under floods.
//
// Every entry is in one of two segments: probation, where a key starts,
// in order of arrival, and protected, where it moves on its second
// decision. When a shard is over its bounds it evicts the oldest entry of
// probation first, and touches protected only when probation is empty;
// there it evicts the least recently used entry, approximately: a use sets
// the entry's referenced bit (one write, to the entry itself, so that a
// decision does not relink a list), and eviction gives an entry whose bit
// is set a second chance (the CLOCK algorithm). A flood of new keys therefore evicts its own keys (each is used
// once), never the state of clients that came back; and a flood that came
// first cannot lock newcomers out, since its keys are the oldest on
// probation. Protected holds at most protectedShare of the shard's bytes;
// past it, its least recently used entry goes back to probation. Keys that
// are back to full are removed by the sweeper, and removing one loses
// nothing, so only entries that were not full count as evictions.

type memShard struct {
	// What a decision reads, on a cache line of its own that the
	// shard's lock does not share: written only when keys come and go.
	idx memIndex
	// slow is not 0 while a decision must take mu (see memPolicy.fast):
	// it counts 1 while ovr is not nil, and 1 for each group or change of
	// limits that holds mu and must not see a decision in its middle.
	// Written under mu.
	slow atomic.Int32
	_    [64 - 20]byte

	mu sync.Mutex

	// ovr holds the overrides of the shard's keys; nil when it has none,
	// which is all a decision checks.
	ovr map[string]*memOverride

	probation, protected memList // sentinels: next is the most recent
	bytes                int64   // accounted bytes of every entry
	protectedBytes       int64
	_                    [32]byte // to a whole number of cache lines (see TestMemEntryLayout)
}

// memList is the sentinel of a circular doubly linked list of entries.
type memList struct{ head memEntry }

func (l *memList) init()             { l.head.prev, l.head.next = &l.head, &l.head }
func (l *memList) oldest() *memEntry { return l.head.prev }

func (l *memList) pushFront(e *memEntry) {
	e.prev, e.next = &l.head, l.head.next
	l.head.next.prev = e
	l.head.next = e
}

func unlink(e *memEntry) {
	e.prev.next, e.next.prev = e.next, e.prev
	e.prev, e.next = nil, nil
}

// A memEntry's lock, mu, guards its states, full and dead; its shard's
// lock guards the rest. Whoever needs both takes the shard's first. A
// decision on a protected entry takes mu alone, so that decisions on
// different keys share no lock and no written cache line.
//
// A decision on a key with one limit writes only the entry's first 64
// bytes: its lock, full, and what a bucket or a window keeps of its state
// (core.State's fields before Log). An entry takes 192 bytes, an
// allocation size class whose objects start on a cache line, so that
// those bytes are one line: under contention on a hot key, one line
// moves between the cores rather than three.
type memEntry struct {
	mu   sync.Mutex
	full int64 // µs: when every limit on the key is back to full
	// one holds the state of a key with one limit, the commonest, so that
	// it is in the entry's own allocation: states is one[:] then.
	one [1]core.State

	// What finding the entry and a decision read, written seldom: the
	// second cache line.
	key  string
	hash uint64 // key's, as the store hashes it
	dead bool   // removed from its shard: a decision that finds it looks again
	nlim uint8  // len(states)
	// use holds useProtected, written under the shard's lock, and useRef,
	// set by a decision that finds it clear (used since eviction last
	// looked at the entry; protected entries only).
	use atomic.Uint32

	states []core.State
	size   int64 // bytes accounted for the entry
	prev   *memEntry
	next   *memEntry
	_      [(192 - 168) * (unsafe.Sizeof(uintptr(0)) / 8)]byte // to 192 bytes on 64-bit platforms
}

// The accounted size of an entry: what the store allocates for it,
// estimated from measurement rather than exactly. entryBase is the entry
// and its slots in the index (16 bytes each, with the hash) at their load
// factor; a key costs its bytes; each limit a State; each sliding log mark
// its two numbers. It errs high: bench/cmd/memrss, with 2,000,000 keys of
// 16 bytes at the default bounds, counted 312 bytes a key for a Go heap
// of 310 with garbage.
const (
	entryBase = 224
	stateSize = int64(unsafe.Sizeof(core.State{}))
	markSize  = int64(unsafe.Sizeof(core.Mark{}))
)

// fullScan is how many of the oldest entries of each segment eviction
// looks at for one already back to full.
const fullScan = 4

// clockScan bounds how many second chances one eviction gives.
const clockScan = 64

// protectedShare is the most of a shard's bytes that protected entries
// may hold, in percent.
const protectedShare = 80

func entrySize(key string, states []core.State) int64 {
	n := entryBase + int64(len(key)) + stateSize*int64(max(len(states), 1))
	for i := range states {
		n += markSize * int64(cap(states[i].Log))
	}
	return n
}

func (sh *memShard) init() {
	sh.idx.init()
	sh.probation.init()
	sh.protected.init()
}

// get returns key's entry, or nil, and records its use; h is key's hash.
// The shard is locked.
func (sh *memShard) get(h uint64, key string, maxBytes int64) *memEntry {
	e := sh.idx.lookup(h, key)
	if e == nil {
		return nil
	}
	if !e.protected() {
		sh.promote(e, maxBytes)
	} else {
		e.touch()
	}
	return e
}

// promote protects e, on its second use, which may push the oldest
// protected entries back to probation. (A use of a protected entry only
// sets its referenced bit: see get.)
func (sh *memShard) promote(e *memEntry, maxBytes int64) {
	unlink(e)
	e.use.Or(useProtected)
	sh.protected.pushFront(e)
	sh.protectedBytes += e.size
	for sh.protectedBytes > maxBytes/100*protectedShare {
		old := sh.protected.oldest()
		if old == e {
			break
		}
		unlink(old)
		old.use.Store(0)
		sh.protectedBytes -= old.size
		sh.probation.pushFront(old)
	}
}

// add puts e, which no other goroutine holds yet, under key (whose hash
// newEntry was given) on probation. The shard is locked.
func (sh *memShard) add(key string, e *memEntry) {
	e.key = key
	e.size = entrySize(key, e.states)
	sh.idx.add(e)
	sh.probation.pushFront(e)
	sh.bytes += e.size
}

// resized re-accounts e after its states changed size (a sliding log grew
// its buffer, or the key took more limits). The shard is locked, and e is
// not.
func (sh *memShard) resized(e *memEntry) {
	e.mu.Lock()
	n := entrySize(e.key, e.states)
	dead := e.dead
	e.mu.Unlock()
	if dead {
		return // remove took what it had
	}
	sh.bytes += n - e.size
	if e.protected() {
		sh.protectedBytes += n - e.size
	}
	e.size = n
}

// remove deletes e, unless onlyFull is set and e is not back to full at
// now; the check and the removal are one step under e's lock, so that no
// decision charges a key as it goes. It reports whether it removed e and
// whether e was back to full. The shard is locked, and e is not.
func (sh *memShard) remove(e *memEntry, now int64, onlyFull bool) (removed, full bool) {
	e.mu.Lock()
	full = e.full <= now
	if onlyFull && !full {
		e.mu.Unlock()
		return false, false
	}
	e.dead = true
	e.mu.Unlock()
	sh.idx.remove(e)
	unlink(e)
	sh.bytes -= e.size
	if e.protected() {
		sh.protectedBytes -= e.size
	}
	return true, full
}

// makeRoom evicts entries until the shard is within maxKeys and maxBytes,
// keeping keep, and returns how many were not yet back to full at now.
func (sh *memShard) makeRoom(maxKeys int, maxBytes, now int64, keep *memEntry) (evicted int) {
	for sh.idx.n > maxKeys || sh.bytes > maxBytes {
		victim := sh.victim(keep, now)
		if victim == nil {
			return evicted // keep is all there is
		}
		if _, full := sh.remove(victim, now, false); !full {
			evicted++
		}
	}
	return evicted
}

// victim returns the entry to evict first, never keep: one already back
// to full among the oldest few of either segment (dropping it loses
// nothing), else the oldest on probation, else a protected one not used
// since the clock hand last passed it.
func (sh *memShard) victim(keep *memEntry, now int64) *memEntry {
	for _, l := range [...]*memList{&sh.probation, &sh.protected} {
		n := 0
		for v := l.oldest(); v != &l.head && n < fullScan; v, n = v.prev, n+1 {
			if v != keep && v.isFull(now) {
				return v
			}
		}
	}
	for v := sh.probation.oldest(); v != &sh.probation.head; v = v.prev {
		if v != keep {
			return v
		}
	}
	// The clock hand: the oldest protected entry is evicted unless it was
	// used since; then it gets a second chance at the front. Bounded: after
	// clockScan chances the oldest goes whatever its bit.
	l := &sh.protected
	for range clockScan {
		v := l.oldest()
		if v == &l.head {
			return nil
		}
		if v != keep && !v.referenced() {
			return v
		}
		v.use.And(^uint32(useRef))
		unlink(v)
		l.pushFront(v)
	}
	for v := l.oldest(); v != &l.head; v = v.prev {
		if v != keep {
			return v
		}
	}
	return nil
}

// quiet waits for a decision that holds e to end. With its shard's slow
// count raised, none starts after it: the caller then has e's states to
// itself while it holds the shard's lock.
func (e *memEntry) quiet() {
	e.mu.Lock()
	//lint:ignore SA2001 an empty critical section is the barrier
	e.mu.Unlock()
}

// The bits of memEntry.use.
const (
	useProtected = 1 << iota
	useRef
)

func (e *memEntry) protected() bool  { return e.use.Load()&useProtected != 0 }
func (e *memEntry) referenced() bool { return e.use.Load()&useRef != 0 }

// touch records a use of e for eviction's clock hand.
func (e *memEntry) touch() {
	if !e.referenced() {
		e.use.Or(useRef)
	}
}

// isFull reports whether e is back to full at now.
func (e *memEntry) isFull(now int64) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.full <= now
}

// newEntry returns an entry for a key with n limits, whose hash is hash.
func newEntry(n int, hash uint64) *memEntry {
	e := &memEntry{nlim: uint8(n), hash: hash}
	if n == 1 {
		e.states = e.one[:]
	} else {
		e.states = make([]core.State, n)
	}
	return e
}
