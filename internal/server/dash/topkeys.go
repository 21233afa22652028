package dash

import (
	"container/heap"
	"sort"
	"sync"
)

// topKeys finds the keys denied most, per rule, in bounded memory: a
// Space-Saving sketch (Metwally, Agrawal and El Abbadi, 2005) of k
// counters over (rule, key) pairs. A pair that is counted takes a free
// counter, or the counter with the smallest count, whose count it
// inherits as its error. So:
//
//   - memory never exceeds k counters, whatever the number of distinct keys;
//   - a reported count overestimates the true one by at most its Error,
//     which is at most N/k for N denials counted;
//   - every pair denied more than N/k times is reported.
//
// Two sketches cover the last minutes: counting goes to the current one,
// which becomes the previous one every window, and a report merges both.
type topKeys struct {
	mu        sync.Mutex
	k         int
	cur, prev *sketch
}

func newTopKeys(k int) *topKeys {
	return &topKeys{k: k, cur: newSketch(k), prev: newSketch(k)}
}

type pair struct{ rule, key string }

type counter struct {
	pair
	count, err uint64
	i          int // its index in the heap
}

// sketch is one Space-Saving sketch: the counters by pair, and a min-heap
// of them by count.
type sketch struct {
	byPair map[pair]*counter
	h      minHeap
	n      uint64   // denials counted
	last   *counter // the counter added to last: denials come in runs
}

func newSketch(k int) *sketch { return &sketch{byPair: make(map[pair]*counter, k)} }

type minHeap []*counter

func (h minHeap) Len() int           { return len(h) }
func (h minHeap) Less(i, j int) bool { return h[i].count < h[j].count }
func (h minHeap) Swap(i, j int)      { h[i], h[j] = h[j], h[i]; h[i].i = i; h[j].i = j }
func (h *minHeap) Push(x any)        { c := x.(*counter); c.i = len(*h); *h = append(*h, c) }
func (h *minHeap) Pop() any {
	old := *h
	c := old[len(old)-1]
	*h = old[:len(old)-1]
	return c
}

func (s *sketch) add(p pair, k int) {
	s.n++
	c := s.last
	if c == nil || c.pair != p {
		c = s.byPair[p]
	}
	if c != nil {
		c.count++
		heap.Fix(&s.h, c.i)
		s.last = c
		return
	}
	if len(s.h) < k {
		c = &counter{pair: p, count: 1}
		s.byPair[p] = c
		heap.Push(&s.h, c)
		s.last = c
		return
	}
	// Replace the smallest: the newcomer may have been counted by it.
	c = s.h[0]
	delete(s.byPair, c.pair)
	c.pair, c.err, c.count = p, c.count, c.count+1
	s.byPair[p] = c
	heap.Fix(&s.h, 0)
	s.last = c
}

// Add counts a denial of key under rule.
func (t *topKeys) Add(rule, key string) {
	t.mu.Lock()
	t.cur.add(pair{rule, key}, t.k)
	t.mu.Unlock()
}

// rotate starts a new window: the current sketch becomes the previous one.
func (t *topKeys) rotate() {
	t.mu.Lock()
	t.prev, t.cur = t.cur, newSketch(t.k)
	t.mu.Unlock()
}

// TopKey is one key in a report of the keys denied most.
type TopKey struct {
	Key   string `json:"key"`
	Count uint64 `json:"count"` // denials, at most Error more than the truth
	Error uint64 `json:"error"`
}

// Top returns, per rule, the n keys denied most in the current and the
// previous window, most first, and the bound on any count's error: the
// denials counted divided by the counters.
func (t *topKeys) Top(n int) (map[string][]TopKey, uint64) {
	t.mu.Lock()
	bound := (t.cur.n + t.prev.n) / uint64(t.k)
	merged := map[pair]TopKey{}
	for _, s := range []*sketch{t.prev, t.cur} {
		for p, c := range s.byPair {
			m := merged[p]
			m.Key, m.Count, m.Error = p.key, m.Count+c.count, m.Error+c.err
			merged[p] = m
		}
	}
	t.mu.Unlock()
	out := map[string][]TopKey{}
	for p, m := range merged {
		out[p.rule] = append(out[p.rule], m)
	}
	for rule, keys := range out {
		sort.Slice(keys, func(i, j int) bool {
			if keys[i].Count != keys[j].Count {
				return keys[i].Count > keys[j].Count
			}
			return keys[i].Key < keys[j].Key
		})
		if len(keys) > n {
			out[rule] = keys[:n]
		}
	}
	return out, bound
}
