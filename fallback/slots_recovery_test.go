package fallback_test

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"github.com/floodgate/floodgate"
	"github.com/floodgate/floodgate/core"
	"github.com/floodgate/floodgate/core/slot"
	"github.com/floodgate/floodgate/fallback"
	"github.com/floodgate/floodgate/internal/lib/permithold"
)

// TestSlotsFailOpenPermits: a permit that FailOpen granted is not lost
// when the primary answers again: its release answers released, and its
// extend moves it onto the primary under its id when there is room there,
// or, while the key is full there, answers held with its expiry unchanged
// until that expiry; the primary never counts more than N. One slot, a
// lease of a minute, on a fixed clock.
func TestSlotsFailOpenPermits(t *testing.T) {
	const lease = time.Minute
	type step struct {
		primary mode
		advance time.Duration // the clock moves on first
		op      string        // acquire, extend, release; recover closes the breaker
		permit  string        // the permit's name in the test
		allowed bool
		source  floodgate.Source
		err     bool          // an error wrapping ErrStore
		expires time.Duration // the permit's expiry after the start, when set
	}
	tests := []struct {
		name      string
		threshold int
		steps     []step
	}{
		{name: "extended once the primary is back: acquired there under its id", steps: []step{
			{primary: failing, op: "acquire", permit: "a", allowed: true, source: floodgate.SourceFailOpen, expires: lease},
			{advance: 10 * time.Second, op: "extend", permit: "a", allowed: true, source: floodgate.SourceStore, expires: 10*time.Second + lease},
			{op: "acquire", permit: "b", source: floodgate.SourceStore},
			{op: "release", permit: "a", allowed: true, source: floodgate.SourceStore},
			{op: "release", permit: "a", source: floodgate.SourceStore},
		}},
		{name: "the primary full: held to its own expiry, then not held", steps: []step{
			{primary: failing, op: "acquire", permit: "a", allowed: true, source: floodgate.SourceFailOpen, expires: lease},
			{advance: 10 * time.Second, op: "acquire", permit: "b", allowed: true, source: floodgate.SourceStore, expires: 10*time.Second + lease},
			{advance: 20 * time.Second, op: "extend", permit: "a", allowed: true, source: floodgate.SourceFailOpen, expires: lease},
			{op: "extend", permit: "b", allowed: true, source: floodgate.SourceStore, expires: 30*time.Second + lease},
			{advance: 30 * time.Second, op: "extend", permit: "a", source: floodgate.SourceFailOpen},
			{op: "release", permit: "a", source: floodgate.SourceStore},
		}},
		{name: "onto the primary once a slot frees there", steps: []step{
			{primary: failing, op: "acquire", permit: "a", allowed: true, source: floodgate.SourceFailOpen, expires: lease},
			{op: "acquire", permit: "b", allowed: true, source: floodgate.SourceStore, expires: lease},
			{advance: 20 * time.Second, op: "extend", permit: "a", allowed: true, source: floodgate.SourceFailOpen, expires: lease},
			{op: "release", permit: "b", allowed: true, source: floodgate.SourceStore},
			{op: "extend", permit: "a", allowed: true, source: floodgate.SourceStore, expires: 20*time.Second + lease},
			{op: "acquire", permit: "c", source: floodgate.SourceStore},
		}},
		{name: "released during and after the outage, once", steps: []step{
			{primary: failing, op: "acquire", permit: "a", allowed: true, source: floodgate.SourceFailOpen},
			{primary: failing, op: "release", permit: "a", allowed: true, source: floodgate.SourceFailOpen},
			{primary: failing, op: "release", permit: "a", err: true},
			{primary: failing, op: "acquire", permit: "b", allowed: true, source: floodgate.SourceFailOpen},
			{op: "release", permit: "b", allowed: true, source: floodgate.SourceFailOpen},
			{op: "release", permit: "b", source: floodgate.SourceStore},
			{op: "acquire", permit: "c", allowed: true, source: floodgate.SourceStore},
		}},
		{name: "extended during the outage, for a lease", steps: []step{
			{primary: failing, op: "acquire", permit: "a", allowed: true, source: floodgate.SourceFailOpen, expires: lease},
			{primary: failing, advance: 30 * time.Second, op: "extend", permit: "a", allowed: true, source: floodgate.SourceFailOpen, expires: 30*time.Second + lease},
			{advance: 50 * time.Second, op: "extend", permit: "a", allowed: true, source: floodgate.SourceStore, expires: 80*time.Second + lease},
		}},
		{name: "expired during the outage", steps: []step{
			{primary: failing, op: "acquire", permit: "a", allowed: true, source: floodgate.SourceFailOpen, expires: lease},
			{primary: failing, advance: lease, op: "extend", permit: "a", source: floodgate.SourceFailOpen},
			{primary: failing, op: "extend", permit: "a", err: true},
		}},
		{name: "granted on the primary after its acquire failed there: counted once", steps: []step{
			{primary: landing, op: "acquire", permit: "a", allowed: true, source: floodgate.SourceFailOpen, expires: lease},
			{op: "acquire", permit: "b", source: floodgate.SourceStore},
			{advance: 10 * time.Second, op: "extend", permit: "a", allowed: true, source: floodgate.SourceStore, expires: 10*time.Second + lease},
			{op: "release", permit: "a", allowed: true, source: floodgate.SourceStore},
			{op: "acquire", permit: "b", allowed: true, source: floodgate.SourceStore},
		}},
		{name: "granted on the primary after its acquire failed there: released there", steps: []step{
			{primary: landing, op: "acquire", permit: "a", allowed: true, source: floodgate.SourceFailOpen},
			{op: "release", permit: "a", allowed: true, source: floodgate.SourceFailOpen},
			{op: "acquire", permit: "b", allowed: true, source: floodgate.SourceStore},
		}},
		{name: "through the open breaker", threshold: 1, steps: []step{
			{primary: failing, op: "acquire", permit: "a", allowed: true, source: floodgate.SourceFailOpen, expires: lease},
			{primary: failing, advance: 30 * time.Second, op: "extend", permit: "a", allowed: true, source: floodgate.SourceFailOpen, expires: 30*time.Second + lease},
			{op: "acquire", permit: "b", allowed: true, source: floodgate.SourceFailOpen, expires: 30*time.Second + lease},
			{op: "recover"},
			{op: "extend", permit: "a", allowed: true, source: floodgate.SourceStore},
			{op: "extend", permit: "b", allowed: true, source: floodgate.SourceFailOpen, expires: 30*time.Second + lease},
			{op: "release", permit: "b", allowed: true, source: floodgate.SourceFailOpen},
			{op: "release", permit: "a", allowed: true, source: floodgate.SourceStore},
		}},
	}
	ctx := context.Background()
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t, fallback.Options{Mode: fallback.FailOpen, Threshold: cmp.Or(tc.threshold, 1000)})
			c, err := floodgate.NewConcurrency(f.store, 1, lease, nil)
			if err != nil {
				t.Fatal(err)
			}
			start := f.clock.Now()
			permits := map[string]floodgate.Permit{}
			for i, st := range tc.steps {
				f.primary.mode.Store(int32(st.primary))
				f.clock.Advance(st.advance)
				var res floodgate.SlotResult
				switch st.op {
				case "recover":
					f.clock.tick(t)
					for f.next(t) != fallback.Primary {
					}
					continue
				case "acquire":
					res, err = c.Acquire(ctx, "k")
				case "extend":
					res, err = c.Extend(ctx, permits[st.permit])
				case "release":
					res, err = c.Release(ctx, permits[st.permit])
				}
				if st.err {
					if !errors.Is(err, floodgate.ErrStore) {
						t.Fatalf("step %d: %s %s: %+v %v, want ErrStore", i, st.op, st.permit, res, err)
					}
					continue
				}
				if err != nil || res.Allowed != st.allowed || res.Source != st.source {
					t.Fatalf("step %d: %s %s: %+v %v, want allowed %v from %v", i, st.op, st.permit, res, err, st.allowed, st.source)
				}
				if st.expires != 0 && !res.Permit.Expires.Equal(start.Add(st.expires)) {
					t.Fatalf("step %d: %s %s expires %v after the start, want %v", i, st.op, st.permit, res.Permit.Expires.Sub(start), st.expires)
				}
				if res.Allowed && st.op == "acquire" {
					permits[st.permit] = res.Permit
				}
			}
		})
	}
}

// TestSlotsFailOpenForgetsTheOldest: the fail-open permits a policy
// remembers are bounded: beyond 10,000 the oldest is forgotten, and its
// extend gets the primary's answer, not held.
func TestSlotsFailOpenForgetsTheOldest(t *testing.T) {
	f := newFixture(t, fallback.Options{Mode: fallback.FailOpen, Threshold: 1 << 30})
	c, err := floodgate.NewConcurrency(f.store, 1, time.Minute, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	f.primary.mode.Store(int32(failing))
	var permits []floodgate.Permit
	for range 10_001 {
		r, err := c.Acquire(ctx, "k")
		if err != nil || !r.Allowed {
			t.Fatal(r, err)
		}
		permits = append(permits, r.Permit)
	}
	f.primary.mode.Store(int32(healthy))
	for _, tc := range []struct {
		p       floodgate.Permit
		allowed bool
		source  floodgate.Source
	}{
		{permits[0], false, floodgate.SourceStore},     // forgotten
		{permits[10_000], true, floodgate.SourceStore}, // the newest: onto the primary
		{permits[1], true, floodgate.SourceFailOpen},   // remembered; the primary is full
	} {
		if r, err := c.Extend(ctx, tc.p); err != nil || r.Allowed != tc.allowed || r.Source != tc.source {
			t.Fatalf("extend: %+v %v, want allowed %v from %v", r, err, tc.allowed, tc.source)
		}
	}
}

// TestSlotsOrphansReleasedTogether: the permits of acquires that failed on
// the primary, which ran them all the same, are released there by the
// next call, all at once (each release here waits for all the others, and
// one made after another would time out), so that the caller waits for
// them one budget at most rather than one each, and before its own op;
// those whose release fails are kept, and released by a later call.
func TestSlotsOrphansReleasedTogether(t *testing.T) {
	const orphans = 16 // one call's worth
	for _, tc := range []struct {
		name string
		fail bool // the first releases fail after they all arrive
	}{{"released", false}, {"kept when the release fails", true}} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t, fallback.Options{Threshold: 1 << 30, Budget: 5 * time.Second})
			c, err := floodgate.NewConcurrency(f.store, 1, time.Minute, nil)
			if err != nil {
				t.Fatal(err)
			}
			direct, err := floodgate.NewConcurrency(f.primary.Store, 1, time.Minute, nil)
			if err != nil {
				t.Fatal(err)
			}
			ctx := context.Background()
			held := func() (n int64) {
				t.Helper()
				for i := range orphans {
					in, err := direct.Inspect(ctx, fmt.Sprint("k", i))
					if err != nil {
						t.Fatal(err)
					}
					n += in.Held
				}
				return n
			}
			f.primary.mode.Store(int32(landing))
			for i := range orphans {
				if r, err := c.Acquire(ctx, fmt.Sprint("k", i)); err != nil || !r.Allowed || r.Source != floodgate.SourceLocal {
					t.Fatal(r, err)
				}
			}
			f.primary.mode.Store(int32(healthy))
			if n := held(); n != orphans {
				t.Fatalf("the primary holds %d permits, want the %d it granted late", n, orphans)
			}
			var arrived atomic.Int64
			all := make(chan struct{})
			f.primary.slotGate = func(ctx context.Context, op slot.Op) error {
				if op.Kind != slot.Release {
					return nil
				}
				if arrived.Add(1) == orphans {
					close(all)
				}
				select {
				case <-all:
				case <-ctx.Done():
					return ctx.Err()
				}
				if tc.fail {
					return floodgate.ErrStore
				}
				return nil
			}
			// k0's own orphan is released first: its acquire finds the slot free.
			if r, err := c.Acquire(ctx, "k0"); err != nil || r.Allowed == tc.fail || r.Source != floodgate.SourceStore {
				t.Fatalf("acquire after the outage: %+v %v", r, err)
			}
			want := int64(1)
			if tc.fail {
				want = orphans
			}
			if n := held(); n != want || arrived.Load() != orphans {
				t.Fatalf("the primary holds %d permits after %d releases, want %d", n, arrived.Load(), want)
			}
			if !tc.fail {
				return
			}
			f.primary.slotGate = nil
			if r, err := c.Acquire(ctx, "x"); err != nil || !r.Allowed {
				t.Fatalf("acquire: %+v %v", r, err)
			}
			if n := held(); n != 0 {
				t.Fatalf("the primary holds %d permits after the kept orphans' release, want 0", n)
			}
		})
	}
}

func (p *parted) PrepareSlots(spec slot.Spec) (slot.Policy, error) {
	sp, err := p.Store.(slot.Store).PrepareSlots(spec)
	return &partedSlots{p, sp}, err
}

type partedSlots struct {
	p *parted
	slot.Policy
}

func (ps *partedSlots) Slot(ctx context.Context, key string, op slot.Op) (slot.Verdict, core.Source, error) {
	if err := ps.p.asked(key); err != nil {
		return slot.Verdict{}, 0, err
	}
	return ps.Policy.Slot(ctx, key, op)
}

// TestSlotsOrphansWaitForTheirPartition: with a partitioned primary (a
// Redis Cluster), a call releases only the orphans of partitions whose
// breaker is closed: those of a failed partition are not tried (which
// would make a caller of a healthy one wait out the budget) until it is
// back.
func TestSlotsOrphansWaitForTheirPartition(t *testing.T) {
	clock := newGateClock()
	primary := newParted(t, clock)
	states := make(chan fallback.State, 4)
	fb := fallback.New(primary, &fallback.Options{Clock: clock, Threshold: 2, ProbeKey: "probe0",
		Logger: slog.New(slog.DiscardHandler), OnSwitch: func(s fallback.State) { states <- s }})
	t.Cleanup(func() { fb.Close() })
	c, err := floodgate.NewConcurrency(fb, 1, time.Minute, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	acquire := func(key string) {
		t.Helper()
		if _, err := c.Acquire(ctx, key); err != nil {
			t.Fatal(err)
		}
	}
	asked := func() map[string]int {
		primary.mu.Lock()
		defer primary.mu.Unlock()
		n := map[string]int{}
		for _, k := range primary.seen {
			n[k]++
		}
		primary.seen = nil
		return n
	}
	primary.down.Store("odd")
	acquire("a1")
	acquire("a1") // two orphans; the odd partition's breaker opens
	if st := <-states; st != fallback.Degraded {
		t.Fatal(st)
	}
	asked()
	primary.down.Store("even")
	acquire("b2") // one orphan; the even breaker stays closed
	primary.down.Store("odd")
	acquire("b2")
	if n := asked(); n["a1"] != 0 || n["b2"] != 3 {
		t.Fatalf("calls while the odd breaker is open: %v, want b2's two acquires and its orphan's release only", n)
	}
	primary.down.Store("")
	<-clock.slept
	clock.tick(t) // the odd breaker's probe succeeds
	if st := <-states; st != fallback.Primary {
		t.Fatal(st)
	}
	asked()
	acquire("b2")
	if n := asked(); n["a1"] != 2 {
		t.Fatalf("calls once the odd partition is back: %v, want a1's two orphans released", n)
	}
}

// TestSlotsFailOpenHeldAcrossRecovery: a request admitted by FailOpen and
// held by the middleware's permit holder (which extends every third of
// the lease, and ends the request when an extend answers not held) is not
// ended when the primary answers again: it moves onto the primary when a
// slot is free there, and otherwise runs to the end of its lease.
func TestSlotsFailOpenHeldAcrossRecovery(t *testing.T) {
	const lease = 3 * time.Minute
	errLost := errors.New("permit lost")
	for _, tc := range []struct {
		name     string
		freeSlot bool // the primary's permit is released before the first extend
		ticks    int  // extends, a third of the lease apart, before the request ends
	}{
		{name: "moved onto the primary", freeSlot: true, ticks: 6},
		{name: "the primary full: held to its expiry", ticks: 3},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t, fallback.Options{Mode: fallback.FailOpen, Threshold: 1 << 30})
			c, err := floodgate.NewConcurrency(f.store, 1, lease, nil)
			if err != nil {
				t.Fatal(err)
			}
			ctx := context.Background()
			f.primary.mode.Store(int32(failing))
			r, err := c.Acquire(ctx, "k")
			if err != nil || !r.Allowed || r.Source != floodgate.SourceFailOpen {
				t.Fatal(r, err)
			}
			h := permithold.New(c, 0, f.clock, slog.New(slog.DiscardHandler), errLost, "test")
			rctx, done := h.Hold(ctx, "k", r.Permit)
			<-f.clock.slept
			f.primary.mode.Store(int32(healthy))
			other, err := c.Acquire(ctx, "k")
			if err != nil || !other.Allowed || other.Source != floodgate.SourceStore {
				t.Fatal(other, err)
			}
			if tc.freeSlot {
				if r, err := c.Release(ctx, other.Permit); err != nil || !r.Allowed {
					t.Fatal(r, err)
				}
			}
			for i := 1; i <= tc.ticks; i++ {
				f.clock.tick(t)
				if !tc.freeSlot {
					// The primary's permit is held on: its key stays full.
					if r, err := c.Extend(ctx, other.Permit); err != nil || !r.Allowed {
						t.Fatal(r, err)
					}
				}
				if i == 3 && !tc.freeSlot {
					break // the permit's expiry: this extend ends the request
				}
				select {
				case <-f.clock.slept:
				case <-rctx.Done():
					t.Fatalf("the request ended at extend %d: %v", i, context.Cause(rctx))
				case <-time.After(5 * time.Second):
					t.Fatalf("extend %d did not end", i)
				}
			}
			if tc.freeSlot {
				// The primary counts the moved permit.
				if r, err := c.Acquire(ctx, "k"); err != nil || r.Allowed || r.Source != floodgate.SourceStore {
					t.Fatalf("acquire beside the moved permit: %+v %v", r, err)
				}
			} else {
				select {
				case <-rctx.Done():
				case <-time.After(5 * time.Second):
					t.Fatal("the request runs past its permit's expiry")
				}
				if !errors.Is(context.Cause(rctx), errLost) {
					t.Fatalf("the request ended with %v", context.Cause(rctx))
				}
			}
			done()
			// The primary holds the other permit alone, or nothing after
			// the moved one's release.
			want := !tc.freeSlot
			if r, err := c.Acquire(ctx, "k"); err != nil || r.Allowed == want {
				t.Fatalf("acquire at the end: %+v %v", r, err)
			}
		})
	}
}

// TestSlotsOrphanEndedByItsHolder: a permit whose acquire landed on the
// primary after failing there, and that its holder then released where
// it was granted (the local store, or FailOpen), is not held again once
// the primary answers, whichever orphans a call releases first: its
// second release and its extend answer not held, and it is released on
// the primary. Before, with more orphans waiting than a call releases,
// they found its copy on the primary and answered Allowed.
func TestSlotsOrphanEndedByItsHolder(t *testing.T) {
	const permits = 3 * 16 // more orphans than a call, or two, releases
	for _, tc := range []struct {
		mode   fallback.Mode
		source floodgate.Source // of the grants while landing
	}{{fallback.Local, floodgate.SourceLocal}, {fallback.FailOpen, floodgate.SourceFailOpen}} {
		t.Run(tc.mode.String(), func(t *testing.T) {
			f := newFixture(t, fallback.Options{Mode: tc.mode, Threshold: 1 << 30})
			c, err := floodgate.NewConcurrency(f.store, permits, time.Minute, nil)
			if err != nil {
				t.Fatal(err)
			}
			direct, err := floodgate.NewConcurrency(f.primary.Store, permits, time.Minute, nil)
			if err != nil {
				t.Fatal(err)
			}
			ctx := context.Background()
			f.primary.mode.Store(int32(landing))
			var granted []floodgate.Permit
			for range permits {
				r, err := c.Acquire(ctx, "k")
				if err != nil || !r.Allowed || r.Source != tc.source {
					t.Fatal(r, err)
				}
				granted = append(granted, r.Permit)
			}
			for _, p := range granted {
				if r, err := c.Release(ctx, p); err != nil || !r.Allowed || r.Source != tc.source {
					t.Fatalf("release where it was granted: %+v %v", r, err)
				}
			}
			f.primary.mode.Store(int32(healthy))
			for i := len(granted) - 1; i >= 0; i-- {
				p := granted[i]
				for _, op := range []func(context.Context, floodgate.Permit) (floodgate.SlotResult, error){c.Release, c.Extend} {
					if r, err := op(ctx, p); err != nil || r.Allowed {
						t.Fatalf("permit %d, released, once the primary answers: %+v %v; want not held", i, r, err)
					}
				}
				if r, err := direct.Extend(ctx, p); err != nil || r.Allowed {
					t.Fatalf("permit %d is held on the primary: %+v %v", i, r, err)
				}
			}
		})
	}
}
