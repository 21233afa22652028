// Package gcfloor lets the garbage collector of a service with a small
// live heap wait until the heap has grown by a floor, rather than by the
// live heap (Go's default, GOGC=100).
//
// A service such as floodgate serve keeps little live data (a few MB with
// the Redis store) but allocates a few KB per request. With GOGC=100 its
// heap goal is about twice the live heap, or Go's 4 MB minimum, so under
// load it collects dozens of times a second, and each cycle costs the same
// however little it finds: scanning every goroutine's stack, shrinking the
// idle ones (which then grow again), assists charged to the requests. A
// floor lets the heap grow enough between collections that they become
// rare (internal/server/envoy's BenchmarkShouldRateLimit shows the CPU per
// request).
//
// With a floor F, after each collection that left L bytes live the next
// one starts when the heap has grown by about max(L, F): GOGC=100 for a
// heap larger than F, and a heap of about L+F for a smaller one. The cost
// is at most F of memory that a collection would have returned.
package gcfloor

import (
	"os"
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"sync"
	"sync/atomic"
)

// minHeap is the Go runtime's smallest heap goal at GOGC=100, which it
// scales with GOGC: a percent p never lets the heap goal fall below
// minHeap×p/100.
const minHeap = 4 << 20

// Percent returns the GOGC percent that makes the next collection start
// when a heap of live bytes has grown by about max(live, floor): 100 when
// live ≥ floor, more below, and never so much that the runtime's scaled
// minimum heap goal would exceed live+floor. live of 0 counts as 1.
func Percent(live, floor uint64) int {
	live = max(live, 1)
	if live >= floor {
		return 100
	}
	p := floor * 100 / live
	p = min(p, (live+floor)*100/minHeap)
	return int(max(p, 100))
}

// active is set while a Floor runs: the GC percent is one per process, so
// there is at most one Floor at a time.
var active atomic.Bool

// Floor keeps the GC percent at Percent(live heap, floor), adjusting it
// after every collection, until Stop. Its methods are safe for concurrent
// use.
type Floor struct {
	floor    uint64
	mu       sync.Mutex // held while adjusting and stopping
	stopped  bool
	prev     int
	samples  []metrics.Sample
	adjusted func(percent int) // for tests: called after each adjustment
}

// Start starts a floor of floor bytes and returns it. It returns nil, and
// changes nothing, when floor is 0, when the GOGC environment variable is
// set (the operator's setting stands), or when another Floor is running.
// A nil *Floor's Stop does nothing.
func Start(floor uint64) *Floor {
	return start(floor, nil)
}

func start(floor uint64, adjusted func(int)) *Floor {
	if floor == 0 || os.Getenv("GOGC") != "" || !active.CompareAndSwap(false, true) {
		return nil
	}
	f := &Floor{floor: floor, adjusted: adjusted, samples: []metrics.Sample{{Name: "/gc/heap/live:bytes"}}}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.prev = debug.SetGCPercent(f.percent())
	f.arm()
	return f
}

// percent returns the percent for the live heap of the last collection.
// f.mu is held.
func (f *Floor) percent() int {
	metrics.Read(f.samples)
	var live uint64
	if f.samples[0].Value.Kind() == metrics.KindUint64 {
		live = f.samples[0].Value.Uint64()
	}
	return Percent(live, f.floor)
}

// arm sets a finalizer on a new unreachable object: it runs after the next
// collection, adjusts the percent and arms again, until Stop. f.mu is held.
func (f *Floor) arm() {
	// A pointer field keeps the object out of the tiny allocator, whose
	// blocks (and their finalizers) can outlive a collection.
	s := &struct{ p *int }{}
	runtime.SetFinalizer(s, func(*struct{ p *int }) {
		f.mu.Lock()
		defer f.mu.Unlock()
		if f.stopped {
			return
		}
		p := f.percent()
		debug.SetGCPercent(p)
		f.arm()
		if f.adjusted != nil {
			f.adjusted(p)
		}
	})
}

// Stop ends the floor and restores the GC percent it found. It is safe to
// call more than once, and on nil.
func (f *Floor) Stop() {
	if f == nil {
		return
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.stopped {
		return
	}
	f.stopped = true
	debug.SetGCPercent(f.prev)
	active.Store(false)
}
