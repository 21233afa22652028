package redisstore

import (
	"fmt"
	"slices"
	"testing"

	"github.com/floodgate/floodgate/core"
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

// bucketsEngine.encode declares each distinct key of a batch once when
// enough of its requests repeat keys, and maps the requests to them with
// a last argument; a batch without repeats, or with too few, declares
// each request's key and override key, as ever.
func TestEncodeDistinctKeys(t *testing.T) {
	f := newFastArgs(&core.Spec{Kind: core.Bucket, Quota: 10, Rate: 10, Period: 1_000_000, TQ: 100_000}, 0)
	p := &policy{fast: f}
	req := func(k string) *call {
		return &call{p: p, keys: []string{"{" + k + "}:0b"}, okey: "{" + k + "}:o", n: 1, now: -1, op: opTake}
	}
	batch := func(keys ...string) []*call {
		calls := make([]*call, len(keys))
		for i, k := range keys {
			calls[i] = req(k)
		}
		return calls
	}
	many := make([]string, 20)
	for i := range many {
		many[i] = fmt.Sprintf("m%d", i)
	}
	for _, tt := range []struct {
		name    string
		calls   []*call
		keys    []string // declared
		keyMap  []int    // the map's runs, place and length, nil for no map
		nargs   int      // arguments, the map's included
		ordered []string // the requests' keys in the order encoded
	}{
		{"distinct", batch("a", "b"), []string{"{a}:0b", "{b}:0b", "{a}:o", "{b}:o"}, nil, 2, []string{"a", "b"}},
		{"one hot key", batch(slices.Repeat([]string{"h"}, 32)...), []string{"{h}:0b", "{h}:o"}, []int{1, 32}, 33, slices.Repeat([]string{"h"}, 32)},
		{"lone first", batch("h", "a", "h", "b", "h", "h"), []string{"{a}:0b", "{b}:0b", "{h}:0b", "{a}:o", "{b}:o", "{h}:o"}, []int{1, 1, 2, 1, 3, 4}, 7, []string{"a", "b", "h", "h", "h", "h"}},
		{"too few repeats", batch(append(slices.Clone(many), "m3")...), nil, nil, 21, nil},
		{"scattered", batch("a", "b", "a", "b", "a", "b"), nil, nil, 6, nil},
		{"runs", batch("a", "a", "a", "b", "b", "b"), []string{"{a}:0b", "{b}:0b", "{a}:o", "{b}:o"}, []int{1, 3, 2, 3}, 7, []string{"a", "a", "a", "b", "b", "b"}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			fr := bucketsEngine{}.encode(nil, tt.calls)
			fr.args = expandArgRuns(fr.args)
			if len(fr.args) != tt.nargs {
				t.Fatalf("%d arguments, want %d", len(fr.args), tt.nargs)
			}
			if tt.keys != nil && !slices.Equal(fr.keys, tt.keys) {
				t.Errorf("keys %q, want %q", fr.keys, tt.keys)
			}
			last, _ := fr.args[len(fr.args)-1].(string)
			if tt.keyMap == nil {
				if len(fr.keys) != 2*fr.n || last != "" && last[0] == keyMapMark {
					t.Errorf("%d keys for %d requests, last argument %q: want each request's two keys and no map", len(fr.keys), fr.n, last)
				}
				return
			}
			want := []byte{keyMapMark, byte(fr.n >> 8), byte(fr.n)}
			for _, j := range tt.keyMap {
				want = append(want, byte(j>>8), byte(j))
			}
			if last != string(want) {
				t.Errorf("map %q, want %q", last, want)
			}
			for i, c := range fr.calls {
				if c.keys[0] != "{"+tt.ordered[i]+"}:0b" {
					t.Errorf("request %d on %s, want %s", i, c.keys[0], tt.ordered[i])
				}
			}
		})
	}
}

// expandArgRuns is expandArgs (bucket.lua) in Go: args with their
// argument map, if any, expanded.
func expandArgRuns(args []any) []any {
	if len(args) == 0 {
		return args
	}
	m, _ := args[len(args)-1].(string)
	if m == "" || m[0] != argMapMark {
		return args
	}
	var out []any
	for r, a := range args[:len(args)-1] {
		for range int(m[1+2*r])<<8 | int(m[2+2*r]) {
			out = append(out, a)
		}
	}
	return out
}

// argRuns sends each run of equal arguments once, with a map of the
// runs' lengths last, when the runs are at most half the arguments; and
// expanding the map gives the arguments back.
func TestArgRuns(t *testing.T) {
	const a, b, g = "AAAA", "BBBB", "g2"
	for _, tt := range []struct {
		name string
		args []any
		want []any // nil: args as they are
	}{
		{"none", nil, nil},
		{"one", []any{a}, nil},
		{"two alike", []any{a, a}, []any{a, "a\x00\x02"}},
		{"alternating", []any{a, b, a, b}, nil},
		{"runs", []any{a, a, a, b, b, a}, []any{a, b, a, "a\x00\x03\x00\x02\x00\x01"}},
		{"a group among them", []any{a, a, g, b, b, b}, []any{a, g, b, "a\x00\x02\x00\x01\x00\x03"}},
		{"too many runs", []any{a, a, b, g, a}, nil},
		{"a long run", slices.Repeat([]any{a}, 300), []any{a, "a\x01\x2c"}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			got := argRuns(slices.Clone(tt.args))
			want := tt.want
			if want == nil {
				want = tt.args
			}
			if !slices.Equal(got, want) {
				t.Errorf("argRuns(%q) = %q, want %q", tt.args, got, want)
			}
			if back := expandArgRuns(got); !slices.Equal(back, tt.args) {
				t.Errorf("expanded, %q, want %q", back, tt.args)
			}
		})
	}
	if args := slices.Repeat([]any{a}, keyMapMax+1); len(argRuns(args)) != len(args) {
		t.Errorf("a run longer than 2 bytes count has a map")
	}
}
