package procs

import (
	"slices"
	"testing"
)

// TestStops checks the order and the once of Stops: Run stops the latest
// first, a second Run stops nothing, and a stop added after Run runs at
// once (a server that starts while a signal stops the others).
func TestStops(t *testing.T) {
	for _, tc := range []struct {
		name       string
		before     int // stops added before Run
		after      int // stops added after it
		runs       int // calls of Run
		wantCalled []int
	}{
		{"none", 0, 0, 1, nil},
		{"latest first", 3, 0, 1, []int{2, 1, 0}},
		{"once", 2, 0, 3, []int{1, 0}},
		{"added after", 1, 2, 1, []int{0, 1, 2}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var s Stops
			var called []int
			add := func(i int) { s.Add(func() { called = append(called, i) }) }
			for i := range tc.before {
				add(i)
			}
			for range tc.runs {
				s.Run()
			}
			for i := range tc.after {
				add(tc.before + i)
			}
			if !slices.Equal(called, tc.wantCalled) {
				t.Errorf("stops ran %v, want %v", called, tc.wantCalled)
			}
		})
	}
}
