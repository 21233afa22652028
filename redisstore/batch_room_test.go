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
