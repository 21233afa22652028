package redisstore

import "testing"

// TestBatcherRoom holds the batcher to maxInflight script calls in flight
// while its batches are small, and to a quarter as many, rounded up, but
// two, while they carry smallBatch calls or more.
func TestBatcherRoom(t *testing.T) {
	tests := []struct {
		name        string
		maxInflight int
		size        int // calls in each script call that went out lately
		inflight    int
		want        bool
	}{
		{"idle", 4, 0, 0, true},
		{"default, small batches, below the cap", 8, 1, 7, true},
		{"default, small batches, at the cap", 8, 1, 8, false},
		{"default, large batches, below two", 8, 13, 1, true},
		{"default, large batches, at two", 8, 13, 2, false},
		{"sixteen, large batches, below a quarter", 16, 13, 3, true},
		{"sixteen, large batches, at a quarter", 16, 13, 4, false},
		{"small batches, below the cap", 4, 1, 3, true},
		{"small batches, at the cap", 4, 2, 4, false},
		{"just below smallBatch", 4, smallBatch - 1, 3, true},
		{"large batches, below two", 4, 19, 1, true},
		{"large batches, at two", 4, 19, 2, false},
		{"at smallBatch, at two", 4, smallBatch, 2, false},
		{"three, large batches: two", 3, 19, 1, true},
		{"three, large batches, at two", 3, 19, 2, false},
		{"one in flight at most", 1, 1, 1, false},
		{"one in flight at most, none yet", 1, 19, 0, true},
		{"two, large batches: still two", 2, 19, 1, true},
		{"two, large batches, at two", 2, 19, 2, false},
		{"two, small batches: two", 2, 1, 1, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b := &batcher{maxInflight: tt.maxInflight}
			// The average settles on a steady size.
			for range 100 {
				b.out(tt.size)
			}
			b.inflight = tt.inflight
			if got := b.room(); got != tt.want {
				t.Errorf("room() = %v with %d in flight, batches of %d/256; want %v", got, tt.inflight, b.size, tt.want)
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
	b.inflight = 2
	if b.room() {
		t.Fatalf("room() after one call of 1 among calls of 19: size %d/256, want closed", b.size)
	}
	for range 40 {
		b.out(2)
	}
	b.inflight = 2
	if !b.room() {
		t.Fatalf("room() after 40 calls of 2: size %d/256, want open", b.size)
	}
}

// TestBatcherAdapt moves the room while batches are small with the script
// calls' round trips: one fewer in flight every adaptEvery calls while
// they take over queued times the least round trip of a call of one, one
// more while they take under uncongested times it, never below two nor
// above maxInflight, and nothing without round trips to go by.
func TestBatcherAdapt(t *testing.T) {
	tests := []struct {
		name        string
		maxInflight int
		base, rtt   int64 // ns: a lone call's round trip first, then every call's
		rounds      int   // of adaptEvery calls after the first
		start       int   // the limit before them (0: maxInflight)
		want        int
	}{
		{"queued: one fewer a round", 8, 100_000, 400_000, 3, 0, 5},
		{"queued: never below two", 8, 100_000, 400_000, 20, 0, 2},
		{"between: unchanged", 8, 100_000, 250_000, 20, 5, 5},
		{"uncongested: one more a round", 8, 100_000, 150_000, 2, 3, 5},
		{"uncongested: never above maxInflight", 8, 100_000, 150_000, 20, 3, 8},
		{"at most one in flight stays one", 1, 100_000, 400_000, 20, 0, 1},
		{"a clock that does not move", 8, 0, 0, 20, 0, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b := &batcher{maxInflight: tt.maxInflight, limit: tt.start}
			// The first round sets the base (a call of one) and the average;
			// its adjustment is undone by starting over from tt.start.
			b.adapt(1, tt.base)
			for range adaptEvery - 1 {
				b.adapt(2, tt.rtt)
			}
			for range 16 * adaptEvery { // the average settles on rtt
				b.adapt(2, tt.rtt)
			}
			b.limit, b.finishes = tt.start, 0
			for range tt.rounds * adaptEvery {
				b.adapt(2, tt.rtt)
			}
			if b.limit != tt.want {
				t.Errorf("limit = %d after %d rounds of %dns against a base of %dns, want %d", b.limit, tt.rounds, tt.rtt, tt.base, tt.want)
			}
		})
	}
}

// TestBatcherAdaptRoom checks that room follows the adapted limit while
// batches are small, and the large batches' rule otherwise.
func TestBatcherAdaptRoom(t *testing.T) {
	b := &batcher{maxInflight: 8, limit: 3}
	b.inflight = 3
	if b.room() {
		t.Errorf("room() with 3 in flight and a limit of 3 = true, want false")
	}
	b.inflight = 2
	if !b.room() {
		t.Errorf("room() with 2 in flight and a limit of 3 = false, want true")
	}
	b.limit = 8
	for range 100 {
		b.out(13)
	}
	if b.room() {
		t.Errorf("room() with large batches, 2 in flight and a limit of 8 = true, want false")
	}
}
