package redisstore

import (
	"math/rand/v2"
	"testing"
	"time"
)

// TestBatcherRoom holds the batcher to maxInflight script calls in flight
// while its batches are small, and to a quarter as many, rounded up, but
// three (never more than maxInflight), while they carry smallBatch calls
// or more; a call then goes out beside one in flight only with half as
// many calls as those carried.
func TestBatcherRoom(t *testing.T) {
	tests := []struct {
		name        string
		maxInflight int
		size        int // calls in each script call that went out lately
		inflight    int
		k           int // calls in the script call that would go out
		want        bool
	}{
		{"idle", 4, 0, 0, 1, true},
		{"default, small batches, below the cap", 8, 1, 7, 1, true},
		{"default, small batches, at the cap", 8, 1, 8, 1, false},
		{"default, large batches, below three", 8, 13, 2, 13, true},
		{"default, large batches, at three", 8, 13, 3, 13, false},
		{"sixteen, large batches, below a quarter", 16, 13, 3, 13, true},
		{"sixteen, large batches, at a quarter", 16, 13, 4, 13, false},
		{"small batches, below the cap", 4, 1, 3, 1, true},
		{"small batches, at the cap", 4, 2, 4, 2, false},
		{"just below smallBatch", 4, smallBatch - 1, 3, 1, true},
		{"large batches, below three", 4, 19, 2, 19, true},
		{"large batches, at three", 4, 19, 3, 19, false},
		{"at smallBatch, at three", 4, smallBatch, 3, smallBatch, false},
		{"three, large batches, below three", 3, 19, 2, 19, true},
		{"three, large batches, at three", 3, 19, 3, 19, false},
		{"one in flight at most", 1, 1, 1, 1, false},
		{"one in flight at most, none yet", 1, 19, 0, 1, true},
		{"two, large batches: still two", 2, 19, 1, 19, true},
		{"two, large batches, at two", 2, 19, 2, 19, false},
		{"two, small batches: two", 2, 1, 1, 1, true},
		{"large batches, one in flight: a call of one waits", 8, 20, 1, 1, false},
		{"large batches, one in flight: just under half waits", 8, 20, 1, 9, false},
		{"large batches, one in flight: half goes", 8, 20, 1, 10, true},
		{"large batches, none in flight: a call of one goes", 8, 20, 0, 1, true},
		{"at smallBatch, one in flight: two of four go", 8, smallBatch, 1, 2, true},
		{"at smallBatch, one in flight: one of four waits", 8, smallBatch, 1, 1, false},
		{"small batches, one in flight: a call of one goes", 8, smallBatch - 1, 1, 1, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b := &batcher{maxInflight: tt.maxInflight}
			// The average settles on a steady size.
			for range 100 {
				b.out(tt.size)
			}
			b.inflight = tt.inflight
			if got := b.room(tt.k); got != tt.want {
				t.Errorf("room(%d) = %v with %d in flight, batches of %d/256; want %v", tt.k, got, tt.inflight, b.size, tt.want)
			}
		})
	}
}

// TestBatcherSizeAverage checks that one small script call among large
// ones, a caller that found nothing queued, does not open the room that
// large batches close, and that the room opens once batches stay small.
func TestBatcherSizeAverage(t *testing.T) {
	b := &batcher{maxInflight: 4}
	for range 100 {
		b.out(19)
	}
	b.out(1)
	b.inflight = 3 // the large batches' room
	if b.room(19) {
		t.Fatalf("room() after one call of 1 among calls of 19: size %d/256, want closed", b.size)
	}
	for range 40 {
		b.out(2)
	}
	b.inflight = 3
	if !b.room(1) {
		t.Fatalf("room() after 40 calls of 2: size %d/256, want open", b.size)
	}
}

// TestBatcherAdapt drives the climb over waits that depend only on the
// limit, as a fixed number of callers would see them without noise: the
// limit settles within a step of the least wait's, never leaves [2,
// maxInflight], and does not move without waits to go by nor while
// batches are large.
func TestBatcherAdapt(t *testing.T) {
	// v-shaped waits, least at best: 100µs there, 10µs more a step away.
	vee := func(best int) func(int) int64 {
		return func(limit int) int64 { return int64(100_000 + 10_000*max(limit-best, best-limit)) }
	}
	tests := []struct {
		name        string
		maxInflight int
		size        int             // calls in each script call
		wait        func(int) int64 // ns: a decision's wait at a limit
		start       int             // the limit before (0: maxInflight)
		lo, hi      int             // where it must stay after settling
	}{
		{"least at four, from eight", 8, 1, vee(4), 0, 3, 5},
		{"least at six, from two", 8, 1, vee(6), 2, 5, 7},
		{"least at eight: stays near eight", 8, 2, vee(8), 0, 7, 8},
		{"least at two: goes down to two", 8, 1, vee(2), 0, 2, 3},
		{"least beyond the cap: the cap", 8, 1, vee(20), 3, 7, 8},
		{"least below two: two", 16, 1, vee(0), 0, 2, 3},
		{"one in flight at most stays one", 1, 1, vee(4), 0, 1, 1},
		{"a clock that does not move", 8, 1, func(int) int64 { return 0 }, 0, 0, 0},
		{"large batches: not moved", 8, smallBatch, vee(2), 8, 8, 8},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b := &batcher{maxInflight: tt.maxInflight, limit: tt.start}
			for range 100 {
				b.out(tt.size)
			}
			window := func() {
				for range adaptEvery {
					b.adapt(tt.size, int64(tt.size)*tt.wait(b.smallLimit()))
				}
			}
			for range 40 { // settling: at most maxInflight steps, and turns
				window()
			}
			for w := range 40 {
				window()
				if b.limit < tt.lo || b.limit > tt.hi {
					t.Fatalf("window %d after settling: limit %d, want it in [%d, %d]", w, b.limit, tt.lo, tt.hi)
				}
			}
		})
	}
}

// TestBatcherAdaptRoom checks that room follows the adapted limit while
// batches are small, and the large batches' rule otherwise.
func TestBatcherAdaptRoom(t *testing.T) {
	b := &batcher{maxInflight: 8, limit: 3}
	b.inflight = 3
	if b.room(1) {
		t.Errorf("room() with 3 in flight and a limit of 3 = true, want false")
	}
	b.inflight = 2
	if !b.room(1) {
		t.Errorf("room() with 2 in flight and a limit of 3 = false, want true")
	}
	b.limit = 8
	for range 100 {
		b.out(13)
	}
	if b.room(13) {
		t.Errorf("room() with large batches, 2 in flight and a limit of 8 = true, want false")
	}
}

// TestBatcherAdaptNoise drives the climb over waits with noise as large
// as the difference between neighbouring limits, as a shared machine's
// windows have: on average the limit stays near the least wait's, and it
// spends most windows within two steps of it.
func TestBatcherAdaptNoise(t *testing.T) {
	tests := []struct {
		name string
		best int
		seed uint64
	}{
		{"least at four", 4, 1},
		{"least at four, another seed", 4, 2},
		{"least at eight", 8, 3},
		{"least at two", 2, 4},
		{"least at six", 6, 5},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rng := rand.New(rand.NewPCG(tt.seed, 7))
			b := &batcher{maxInflight: 8}
			b.out(1)
			const windows = 2000
			var sum, near int
			for range windows {
				l := b.smallLimit()
				d := max(l-tt.best, tt.best-l)
				// 100µs at best, 10µs more a step, ±10µs of noise.
				wait := int64(100_000 + 10_000*d + rng.IntN(20_001) - 10_000)
				for range adaptEvery {
					b.adapt(1, wait)
				}
				sum += l
				if d <= 2 {
					near++
				}
			}
			mean := float64(sum) / windows
			if mean < float64(tt.best)-1 || mean > float64(tt.best)+1 {
				t.Errorf("mean limit %.2f, want within one of %d", mean, tt.best)
			}
			if near < windows*3/4 {
				t.Errorf("%d of %d windows within two steps of %d, want three quarters", near, windows, tt.best)
			}
		})
	}
}

// TestLingerFor holds a Cluster master's wait for company to its rule:
// only while its batches are large, other masters' script calls are in
// flight and fewer than its share of the callers are queued for it; then
// two round trips, and maxLinger at most.
func TestLingerFor(t *testing.T) {
	const ms = int64(time.Millisecond)
	tests := []struct {
		name                                  string
		large                                 bool
		masters, callers, pending, out, batch int
		rtt                                   int64
		want                                  time.Duration
	}{
		{"small batches: go", false, 6, 64, 2, 5, 64, ms / 2, 0},
		{"one master: go", true, 1, 64, 2, 0, 64, ms / 2, 0},
		{"nothing else in flight: go", true, 6, 64, 2, 0, 64, ms / 2, 0},
		{"its share queued: go", true, 6, 64, 10, 5, 64, ms / 2, 0},
		{"a full batch queued: go", true, 6, 640, 64, 5, 64, ms / 2, 0},
		{"below its share: two round trips", true, 6, 64, 9, 5, 64, ms / 4, time.Millisecond / 2},
		{"below a full batch: two round trips", true, 6, 640, 63, 5, 64, ms / 8, time.Millisecond / 4},
		{"a slow round trip: maxLinger", true, 6, 64, 2, 5, 64, 30 * ms, maxLinger},
		{"no round trip yet: go", true, 6, 64, 2, 5, 64, 0, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := lingerFor(tt.large, tt.masters, tt.callers, tt.pending, tt.out, tt.batch, tt.rtt); got != tt.want {
				t.Fatalf("lingerFor = %v, want %v", got, tt.want)
			}
		})
	}
}
