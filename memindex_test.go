package floodgate

import (
	"fmt"
	"sync"
	"testing"
)

// TestMemIndex adds, finds and removes entries, with hashes that collide
// (the probes then run through gone slots), hashes that differ but start
// their probes at one slot (a probe then passes slots by their hashes
// alone), and enough keys to grow and clean the table several times.
func TestMemIndex(t *testing.T) {
	for _, tc := range []struct {
		name string
		hash func(i int) uint64
	}{
		{"spread", func(i int) uint64 { return uint64(i) * 0x9e3779b97f4a7c15 }},
		{"colliding", func(i int) uint64 { return uint64(i % 3) }},
		{"one start", func(i int) uint64 { return uint64(i+1) << 40 }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var x memIndex
			x.init()
			entries := make([]*memEntry, 200)
			for i := range entries {
				entries[i] = &memEntry{key: fmt.Sprint("k", i), hash: tc.hash(i)}
			}
			for round := range 3 {
				added := 0
				for i, e := range entries {
					if i%3 != round {
						x.add(e)
						added++
					}
				}
				for i, e := range entries {
					got := x.lookup(e.hash, e.key)
					if want := i%3 != round; (got == e) != want || (got != nil && got != e) {
						t.Fatalf("round %d: lookup(%s) = %p, want present %v", round, e.key, got, want)
					}
				}
				if x.n != added {
					t.Fatalf("round %d: n = %d, want %d", round, x.n, added)
				}
				for i, e := range entries {
					if i%3 != round {
						x.remove(e)
					}
				}
				x.remove(entries[0]) // not there: no change
				if x.n != 0 {
					t.Fatalf("round %d: n = %d after removing every entry", round, x.n)
				}
				seen := 0
				x.all(func(*memEntry) { seen++ })
				if seen != 0 {
					t.Fatalf("round %d: all saw %d entries in an empty index", round, seen)
				}
			}
		})
	}
}

// TestMemIndexConcurrentReaders reads an index without a lock while one
// writer, holding what stands for the shard's lock, adds, removes and so
// regrows it: under -race, the readers find every key that stays in it.
func TestMemIndexConcurrentReaders(t *testing.T) {
	var x memIndex
	x.init()
	stay := &memEntry{key: "stay", hash: 42}
	x.add(stay)
	var wg sync.WaitGroup
	done := make(chan struct{})
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-done:
					return
				default:
				}
				if x.lookup(stay.hash, stay.key) != stay {
					t.Error("a reader lost a key that stays in the index")
					return
				}
			}
		}()
	}
	for i := range 5000 {
		e := &memEntry{key: fmt.Sprint("k", i), hash: uint64(i) * 0x9e3779b97f4a7c15}
		x.add(e)
		if i%2 == 0 {
			x.remove(e)
		}
	}
	close(done)
	wg.Wait()
}
