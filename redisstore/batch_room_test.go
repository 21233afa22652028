package redisstore

import "testing"

// TestBatcherRoom holds the batcher to maxInflight script calls in flight
// while its batches are small, and to half as many, rounded up, while
// they carry smallBatch calls or more.
func TestBatcherRoom(t *testing.T) {
	tests := []struct {
		name        string
		maxInflight int
		size        int // calls in each script call that went out lately
		inflight    int
		want        bool
	}{
		{"idle", 4, 0, 0, true},
		{"small batches, below the cap", 4, 1, 3, true},
		{"small batches, at the cap", 4, 2, 4, false},
		{"just below smallBatch", 4, smallBatch - 1, 3, true},
		{"large batches, below half", 4, 19, 1, true},
		{"large batches, at half", 4, 19, 2, false},
		{"at smallBatch, at half", 4, smallBatch, 2, false},
		{"odd cap rounds half up", 3, 19, 1, true},
		{"odd cap, at half", 3, 19, 2, false},
		{"one in flight at most", 1, 1, 1, false},
		{"one in flight at most, none yet", 1, 19, 0, true},
		{"two, large batches: one", 2, 19, 1, false},
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
