package floodgate

import "sync/atomic"

// memIndex is a shard's index of its entries by key: an open-addressing
// hash table that a decision reads without any lock, while the shard
// changes it under its own lock. It replaces a map guarded by the shard's
// lock, which made every decision on the shard's keys take that lock, and
// sync.Map, whose keys are interfaces: hashing and comparing them was a
// tenth of a decision.
//
// A reader loads the table, then probes it from the key's hash; a slot
// holds nil (the probe ends), gone (a removed entry: the probe goes on) or
// an entry, beside that entry's hash, so that a probe passes the slots of
// other keys without reading their entries: each would be a cache miss.
// The writer never moves an entry within a table: it grows or cleans the
// table by building a new one and swapping it in. A reader
// that still holds an old table can find an entry removed since, which
// the entry's dead flag tells it, or miss one added since; either way it
// goes to the shard's lock, where the index is current.
type memIndex struct {
	tab atomic.Pointer[memTable]
	n   int // live entries; the shard's lock
}

type memTable struct {
	slots []memSlot // a power of two of them
	used  int       // slots not nil: live and gone; the shard's lock
}

// memSlot is a slot of a memTable. hash is written once, before e is
// first stored, and e is never nil again after: a reader that loads e
// not nil may read hash without a lock.
type memSlot struct {
	hash uint64 // the hash of the entry e was first stored with
	e    atomic.Pointer[memEntry]
}

// gone marks the slot of a removed entry. It is never locked, read or
// written: only its address is used.
var gone = new(memEntry)

// minSlots is the size of an empty index's table.
const minSlots = 8

func (x *memIndex) init() {
	x.tab.Store(&memTable{slots: make([]memSlot, minSlots)})
	x.n = 0
}

// lookup returns key's entry, whose hash is h, or nil. It takes no lock.
func (x *memIndex) lookup(h uint64, key string) *memEntry {
	t := x.tab.Load()
	mask := uint64(len(t.slots) - 1)
	for i := h & mask; ; i = (i + 1) & mask {
		sl := &t.slots[i]
		e := sl.e.Load()
		if e == nil {
			return nil
		}
		if sl.hash == h && e != gone && e.key == key {
			return e
		}
	}
}

// add puts e, whose key is not in the index, under its hash. The shard is
// locked.
func (x *memIndex) add(e *memEntry) {
	t := x.tab.Load()
	if (t.used+1)*4 > len(t.slots)*3 {
		t = x.rebuild(x.n + 1)
	}
	t.put(e)
	x.n++
}

// put stores e in the first free slot from its hash's.
func (t *memTable) put(e *memEntry) {
	mask := uint64(len(t.slots) - 1)
	i := e.hash & mask
	for t.slots[i].e.Load() != nil {
		i = (i + 1) & mask
	}
	t.slots[i].hash = e.hash
	t.slots[i].e.Store(e)
	t.used++
}

// remove takes e out of the index. The shard is locked.
func (x *memIndex) remove(e *memEntry) {
	t := x.tab.Load()
	mask := uint64(len(t.slots) - 1)
	for i := e.hash & mask; ; i = (i + 1) & mask {
		switch t.slots[i].e.Load() {
		case e:
			t.slots[i].e.Store(gone)
			x.n--
			return
		case nil:
			return // not there: nothing to do
		}
	}
}

// rebuild swaps in a new table, without the gone slots, sized for want
// entries at most half full, and returns it. The shard is locked.
func (x *memIndex) rebuild(want int) *memTable {
	size := minSlots
	for size < 2*want {
		size *= 2
	}
	old := x.tab.Load()
	t := &memTable{slots: make([]memSlot, size)}
	for j := range old.slots {
		if e := old.slots[j].e.Load(); e != nil && e != gone {
			t.put(e)
		}
	}
	x.tab.Store(t)
	return t
}

// all calls fn for every entry in the index; fn may remove the entry it
// is given. The shard is locked.
func (x *memIndex) all(fn func(e *memEntry)) {
	t := x.tab.Load()
	for j := range t.slots {
		if e := t.slots[j].e.Load(); e != nil && e != gone {
			fn(e)
		}
	}
}
