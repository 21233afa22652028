package redisstore

import (
	"testing"
	"time"
)

// hot counts a key's decisions in a window of a lease's time that starts
// at its first one, on a fixed clock: the one after hotHits in a window is
// hot. Another key in its slot starts the window again, another slot does
// not, nor does a clock that went back, and the times' bits wrap.
func TestLeasesHot(t *testing.T) {
	const (
		a     = uint64(0x1234)<<48 | 7 // a key's hash: slot 7, tag 0x1234
		b     = uint64(0x4321)<<48 | 7 // another key in slot 7
		c     = uint64(0x1234)<<48 | 8 // a's tag, another slot
		t0    = int64(1_767_225_600_000_000)
		lease = int64(10_000) // µs
	)
	type sight struct {
		h   uint64
		at  int64
		hot bool
	}
	// run is n decisions of h at at.
	run := func(h uint64, at int64, n int, hot bool) []sight {
		s := make([]sight, n)
		for i := range s {
			s[i] = sight{h, at, hot}
		}
		return s
	}
	cat := func(runs ...[]sight) []sight {
		var all []sight
		for _, r := range runs {
			all = append(all, r...)
		}
		return all
	}
	for _, tc := range []struct {
		name   string
		sights []sight
	}{
		{"hotHits at once are cold", run(a, t0, hotHits, false)},
		{"the next is hot", cat(run(a, t0, hotHits, false), run(a, t0, 20, true))},
		{"within the window", cat(run(a, t0, hotHits, false), run(a, t0+lease-1, 1, true))},
		{"after it a window starts", cat(run(a, t0, hotHits, false), run(a, t0+lease, hotHits, false), run(a, t0+lease+1, 1, true))},
		{"another key in the slot", cat(run(a, t0, hotHits, false), run(b, t0, 1, false), run(a, t0, hotHits, false), run(a, t0, 1, true))},
		{"another slot", cat(run(a, t0, hotHits-1, false), run(c, t0, 1, false), run(a, t0, 1, false), run(a, t0, 1, true))},
		{"the clock went back", cat(run(a, t0, hotHits, false), run(a, t0-1, hotHits, false), run(a, t0-1, 1, true))},
		{"the time's 44 bits wrap", cat(run(a, 1<<44-1, hotHits, false), run(a, 1<<44, 1, true))},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l := &leases{opts: LeaseOptions{Time: time.Duration(lease) * time.Microsecond}}
			for i, s := range tc.sights {
				if got := l.hot(s.h, s.at); got != s.hot {
					t.Fatalf("decision %d (%#x at %d): hot = %v, want %v", i+1, s.h, s.at, got, s.hot)
				}
			}
		})
	}
}
