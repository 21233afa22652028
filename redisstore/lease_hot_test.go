package redisstore

import (
	"testing"
	"time"
)

// hot tells a key seen again within a lease's time, on a fixed clock,
// from one seen later, from another key in its slot, and from a clock
// that went back.
func TestLeasesHot(t *testing.T) {
	const (
		a     = uint64(0x1234)<<48 | 7 // a key's hash: slot 7, tag 0x1234
		b     = uint64(0x4321)<<48 | 7 // another key in slot 7
		c     = uint64(0x1234)<<48 | 8 // a's tag, another slot
		t0    = int64(1_767_225_600_000_000)
		lease = int64(10_000) // µs
	)
	type seen struct {
		h   uint64
		at  int64
		hot bool
	}
	for _, tc := range []struct {
		name string
		seen []seen
	}{
		{"first sight is cold", []seen{{a, t0, false}}},
		{"again at once", []seen{{a, t0, false}, {a, t0, true}}},
		{"again within the lease's time", []seen{{a, t0, false}, {a, t0 + lease - 1, true}}},
		{"again after it", []seen{{a, t0, false}, {a, t0 + lease, false}, {a, t0 + lease + 1, true}}},
		{"another key in the slot", []seen{{a, t0, false}, {b, t0 + 1, false}, {a, t0 + 2, false}, {a, t0 + 3, true}}},
		{"another slot", []seen{{a, t0, false}, {c, t0 + 1, false}, {a, t0 + 2, true}}},
		{"the clock went back", []seen{{a, t0, false}, {a, t0 - 1, false}, {a, t0 - 1, true}}},
		{"the time's 48 bits wrap", []seen{{a, 1<<48 - 1, false}, {a, 1 << 48, true}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l := &leases{opts: LeaseOptions{Time: time.Duration(lease) * time.Microsecond}}
			for i, s := range tc.seen {
				if got := l.hot(s.h, s.at); got != s.hot {
					t.Fatalf("sight %d (%#x at %d): hot = %v, want %v", i+1, s.h, s.at, got, s.hot)
				}
			}
		})
	}
}
