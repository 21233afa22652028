package floodgate

import (
	"sync"
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
	mu sync.Mutex
	m  map[string]*memEntry
	// last is the entry of lastKey, the key this shard found last: a hot
	// key skips the map lookup (and its second hash of the key). It is
	// cleared whenever lastKey leaves the map.
	last    *memEntry
	lastKey string

	// ovr holds the overrides of the shard's keys; nil when it has none,
	// which is all a decision checks.
	ovr map[string]*memOverride

	probation, protected memList // sentinels: next is the most recent
	bytes                int64   // accounted bytes of every entry
	protectedBytes       int64
	_                    [16]byte // keeps neighbouring shards' locks off one cache line
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

type memEntry struct {
	// What every decision reads and writes comes first, on one cache line.
	full      int64 // µs: when every limit on the key is back to full
	states    []core.State
	protected bool
	ref       bool // used since eviction last looked at it (protected only)
	// one holds the state of a key with one limit, the commonest, so that
	// it is in the entry's own allocation: states is one[:] then.
	one [1]core.State

	key  string
	size int64 // bytes accounted for the entry
	prev *memEntry
	next *memEntry
}

// The accounted size of an entry: what the store allocates for it,
// estimated from measurement rather than exactly. entryBase is the map's
// slot at its load factor, the entry and its slice headers, and the
// allocator's rounding (bench/cmd/memrss measured about 200 bytes for a
// one-limit key beyond its key's bytes and its State); a key costs its
// bytes; each limit a State; each sliding log mark its two numbers.
const (
	entryBase = 192
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
	sh.m = make(map[string]*memEntry)
	sh.probation.init()
	sh.protected.init()
}

// get returns key's entry, or nil, and records its use. The shard is
// locked.
func (sh *memShard) get(key string, maxBytes int64) *memEntry {
	e := sh.last
	if e == nil || sh.lastKey != key {
		if e = sh.m[key]; e == nil {
			return nil
		}
		sh.last, sh.lastKey = e, key
	}
	if !e.protected {
		sh.promote(e, maxBytes)
	} else if !e.ref {
		e.ref = true
	}
	return e
}

// promote protects e, on its second use, which may push the oldest
// protected entries back to probation. (A use of a protected entry only
// sets its referenced bit: see get.)
func (sh *memShard) promote(e *memEntry, maxBytes int64) {
	unlink(e)
	e.protected = true
	sh.protected.pushFront(e)
	sh.protectedBytes += e.size
	for sh.protectedBytes > maxBytes/100*protectedShare {
		old := sh.protected.oldest()
		if old == e {
			break
		}
		unlink(old)
		old.protected, old.ref = false, false
		sh.protectedBytes -= old.size
		sh.probation.pushFront(old)
	}
}

// add puts e under key on probation. The shard is locked.
func (sh *memShard) add(key string, e *memEntry) {
	e.key = key
	e.size = entrySize(key, e.states)
	sh.m[key] = e
	sh.last, sh.lastKey = e, key
	sh.probation.pushFront(e)
	sh.bytes += e.size
}

// resized re-accounts e after its states changed size (a sliding log grew
// its buffer, or the key took more limits).
func (sh *memShard) resized(e *memEntry) {
	n := entrySize(e.key, e.states)
	sh.bytes += n - e.size
	if e.protected {
		sh.protectedBytes += n - e.size
	}
	e.size = n
}

// remove deletes e. The shard is locked.
func (sh *memShard) remove(e *memEntry) {
	if sh.last == e {
		sh.last, sh.lastKey = nil, ""
	}
	delete(sh.m, e.key)
	unlink(e)
	sh.bytes -= e.size
	if e.protected {
		sh.protectedBytes -= e.size
	}
}

// makeRoom evicts entries until the shard is within maxKeys and maxBytes,
// keeping keep, and returns how many were not yet back to full at now.
func (sh *memShard) makeRoom(maxKeys int, maxBytes, now int64, keep *memEntry) (evicted int) {
	for len(sh.m) > maxKeys || sh.bytes > maxBytes {
		victim := sh.victim(keep, now)
		if victim == nil {
			return evicted // keep is all there is
		}
		if victim.full > now {
			evicted++
		}
		sh.remove(victim)
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
			if v != keep && v.full <= now {
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
		if v != keep && !v.ref {
			return v
		}
		v.ref = false
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

// newEntry returns an entry for a key with n limits.
func newEntry(n int) *memEntry {
	e := &memEntry{}
	if n == 1 {
		e.states = e.one[:]
	} else {
		e.states = make([]core.State, n)
	}
	return e
}
