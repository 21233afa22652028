package redisstore

import (
	"fmt"
	"slices"
	"testing"
)

// repeats marks each key that a batch holds more than once, by the
// nested loop of small batches and by the map of larger ones alike.
func TestRepeats(t *testing.T) {
	many := func(n int, dup ...int) ([]string, []bool) {
		keys, want := make([]string, n), make([]bool, n)
		for i := range keys {
			keys[i] = fmt.Sprintf("k%d", i)
		}
		for _, d := range dup {
			keys[d] = keys[0]
			want[0], want[d] = true, true
		}
		return keys, want
	}
	big, bigWant := many(40, 17, 39)
	small, smallWant := many(5, 3)
	for _, tt := range []struct {
		name string
		keys []string
		want []bool // nil: none repeats
	}{
		{"empty", nil, nil},
		{"one", []string{"a"}, nil},
		{"distinct", []string{"a", "b", "c"}, nil},
		{"pair", []string{"a", "b", "a"}, []bool{true, false, true}},
		{"three times", []string{"x", "x", "y", "x"}, []bool{true, true, false, true}},
		{"small", small, smallWant},
		{"large, distinct", func() []string { k, _ := many(40); return k }(), nil},
		{"large", big, bigWant},
	} {
		t.Run(tt.name, func(t *testing.T) {
			if got := repeats(tt.keys); !slices.Equal(got, tt.want) {
				t.Errorf("repeats(%q) = %v, want %v", tt.keys, got, tt.want)
			}
		})
	}
}
