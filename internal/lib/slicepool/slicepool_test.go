package slicepool

import "testing"

// A slice comes back as long as asked and all zero, whatever the call
// before it left in it, and one too short for the call is not reused.
func TestPool(t *testing.T) {
	var p Pool[*int]
	x := 1
	tests := []struct {
		n      int
		reused bool // the slice put back last is returned
	}{
		{3, false},
		{2, true},
		{3, true},
		{5, false},
		{1, true},
	}
	var last *[]*int
	for i, tt := range tests {
		s := p.Get(tt.n)
		if len(*s) != tt.n {
			t.Fatalf("step %d: len %d, want %d", i, len(*s), tt.n)
		}
		for j, v := range (*s)[:cap(*s)] {
			if v != nil {
				t.Fatalf("step %d: element %d not cleared", i, j)
			}
		}
		// sync.Pool may drop what it holds, so a miss is allowed; a
		// slice too short must never come back.
		if reused := s == last; reused && !tt.reused {
			t.Fatalf("step %d: a slice of cap %d reused for %d", i, cap(*s), tt.n)
		}
		for j := range *s {
			(*s)[j] = &x
		}
		p.Put(s)
		last = s
	}
}
