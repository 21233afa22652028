package floodgate

import (
	"context"
	"testing"
	"time"
)

type fixedClock struct{ t time.Time }

func (c *fixedClock) Now() time.Time                                   { return c.t }
func (c *fixedClock) Sleep(ctx context.Context, d time.Duration) error { c.t = c.t.Add(d); return nil }

// TestMemSlotsForget checks that keys whose permits expired are dropped
// by later operations on other keys, so that abandoned permits do not
// hold memory.
func TestMemSlotsForget(t *testing.T) {
	clock := &fixedClock{t: time.Unix(1000, 0)}
	s := NewMemoryStore(&MemoryOptions{Clock: clock, SweepInterval: -1})
	defer s.Close()
	c, err := NewConcurrency(s, 1, time.Second, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	const keys = 200
	for i := range keys {
		if r, err := c.Acquire(ctx, string(rune('a'+i%26))+string(rune(i))); err != nil || !r.Allowed {
			t.Fatal(r, err)
		}
	}
	if n := s.slots.slotKeys(); n != keys {
		t.Fatalf("%d keys held, want %d", n, keys)
	}
	clock.t = clock.t.Add(time.Second)
	for i := 0; i < 10*keys && s.slots.slotKeys() > 1; i++ {
		r, err := c.Acquire(ctx, "new")
		if err != nil {
			t.Fatal(err)
		}
		if _, err := c.Release(ctx, r.Permit); err != nil {
			t.Fatal(err)
		}
	}
	if n := s.slots.slotKeys(); n > 1 {
		t.Fatalf("%d keys with expired permits are still held", n)
	}
}

// TestMemSlotsFull checks the bound on keys: a shard full of live
// permits refuses a new key with a store error, and takes it once they
// expire.
func TestMemSlotsFull(t *testing.T) {
	clock := &fixedClock{t: time.Unix(1000, 0)}
	s := NewMemoryStore(&MemoryOptions{Clock: clock, SweepInterval: -1, MaxKeys: 16})
	defer s.Close()
	c, _ := NewConcurrency(s, 1, time.Second, nil)
	ctx := context.Background()
	var failed error
	for i := 0; i < 64 && failed == nil; i++ {
		_, failed = c.Acquire(ctx, string(rune('A'+i)))
	}
	if failed == nil {
		t.Fatal("64 keys of live permits in a store of 16 keys")
	}
	clock.t = clock.t.Add(time.Second)
	for i := 0; i < 64; i++ {
		if _, err := c.Acquire(ctx, string(rune('A'+i))); err != nil {
			t.Fatal(err)
		}
		clock.t = clock.t.Add(time.Second)
	}
}
