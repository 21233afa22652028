package floodgate

import (
	"testing"
	"time"
)

// TestSystemClock checks that the system clock starts at the time of day,
// never goes backwards, and that the memory store's integer read agrees
// with Now. It reads the real clock but never sleeps.
func TestSystemClock(t *testing.T) {
	before := time.Now()
	c := SystemClock().(*systemClock)
	if d := c.Now().Sub(before); d < 0 || d > time.Second {
		t.Fatalf("Now is %v after time.Now, want within a second", d)
	}
	prev := c.micros()
	for range 10000 {
		a := c.micros()
		b := c.Now().UnixMicro()
		z := c.micros()
		if a < prev || z < a {
			t.Fatalf("micros went backwards: %d, then %d, then %d", prev, a, z)
		}
		// micros rounds the start and the elapsed time down apart, so it
		// may read one microsecond below Now.
		if b < a-1 || b > z+1 {
			t.Fatalf("Now().UnixMicro() = %d, outside micros' [%d, %d]", b, a, z)
		}
		prev = z
	}
	if s := NewMemoryStore(&MemoryOptions{SweepInterval: -1}); s.sys == nil {
		t.Fatal("the default memory store does not use the system clock's integer read")
	}
}
