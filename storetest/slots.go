package storetest

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/floodgate/floodgate"
	"github.com/floodgate/floodgate/core/slot"
)

// SlotOp is what a SlotStep does.
type SlotOp uint8

// The operations of a SlotStep.
const (
	SlotAcquire SlotOp = iota // Concurrency.Acquire; the permit is remembered as the step's Permit
	SlotRelease               // Concurrency.Release of the step's Permit
	SlotExtend                // Concurrency.Extend of the step's Permit
)

// SlotStep is one call of a SlotScenario, at a time relative to Base.
type SlotStep struct {
	At     time.Duration
	Op     SlotOp
	Key    string // "k" when empty
	Permit string // the name an Acquire gives its permit, or a Release or Extend uses
	// Want is the result expected: Allowed, Held, and RetryAfter; Expires
	// is the permit's expiry as an offset from Base (0 for none).
	Want    floodgate.SlotResult
	Expires time.Duration
}

// SlotScenario is a sequence of slot steps on a fresh store, under one
// concurrency limit.
type SlotScenario struct {
	Name  string
	N     int64
	Lease time.Duration
	Steps []SlotStep
}

func held(allowed bool, n int64) floodgate.SlotResult {
	return floodgate.SlotResult{Allowed: allowed, Held: n}
}

func full(n int64, retry time.Duration) floodgate.SlotResult {
	return floodgate.SlotResult{Held: n, RetryAfter: retry}
}

// SlotScenarios returns the concurrency limit scenarios every store
// passes: the N-th and N+1-th acquire, release and double release,
// expiry at the lease and not before, extend, and keys apart.
func SlotScenarios() []SlotScenario {
	return []SlotScenario{
		{Name: "nth-and-n+1th", N: 3, Lease: 10 * sec, Steps: []SlotStep{
			{At: 0, Permit: "a", Want: held(true, 1), Expires: 10 * sec},
			{At: 1 * sec, Permit: "b", Want: held(true, 2), Expires: 11 * sec},
			{At: 2 * sec, Permit: "c", Want: held(true, 3), Expires: 12 * sec},
			{At: 3 * sec, Permit: "d", Want: full(3, 7*sec)},
			{At: 3 * sec, Permit: "e", Key: "other", Want: held(true, 1), Expires: 13 * sec},
			{At: 9*sec + 999999*us, Permit: "d", Want: full(3, 1*us)},
			{At: 10 * sec, Permit: "d", Want: held(true, 3), Expires: 20 * sec},
		}},
		{Name: "release-and-double-release", N: 2, Lease: 5 * sec, Steps: []SlotStep{
			{At: 0, Permit: "a", Want: held(true, 1), Expires: 5 * sec},
			{At: 0, Permit: "b", Want: held(true, 2), Expires: 5 * sec},
			{At: 100 * ms, Permit: "c", Want: full(2, 4900*ms)},
			{At: 200 * ms, Op: SlotRelease, Permit: "a", Want: held(true, 1)},
			{At: 300 * ms, Op: SlotRelease, Permit: "a", Want: held(false, 1)},
			{At: 400 * ms, Permit: "c", Want: held(true, 2), Expires: 5400 * ms},
			{At: 500 * ms, Op: SlotRelease, Permit: "b", Want: held(true, 1)},
			{At: 500 * ms, Op: SlotRelease, Permit: "c", Want: held(true, 0)},
			{At: 500 * ms, Op: SlotRelease, Permit: "c", Want: held(false, 0)},
			{At: 500 * ms, Op: SlotExtend, Permit: "c", Want: held(false, 0)},
		}},
		{Name: "expiry", N: 1, Lease: 2 * sec, Steps: []SlotStep{
			{At: 0, Permit: "a", Want: held(true, 1), Expires: 2 * sec},
			{At: 2*sec - us, Permit: "b", Want: full(1, us)},
			{At: 2 * sec, Op: SlotRelease, Permit: "a", Want: held(false, 0)},
			{At: 2 * sec, Op: SlotExtend, Permit: "a", Want: held(false, 0)},
			{At: 2 * sec, Permit: "b", Want: held(true, 1), Expires: 4 * sec},
			// The clock steps back: b keeps its expiry, so its slot
			// is not freed before its lease, and denies for longer.
			{At: 1 * sec, Permit: "c", Want: full(1, 3*sec)},
			{At: 4 * sec, Permit: "c", Want: held(true, 1), Expires: 6 * sec},
		}},
		{Name: "extend", N: 1, Lease: 3 * sec, Steps: []SlotStep{
			{At: 0, Permit: "a", Want: held(true, 1), Expires: 3 * sec},
			{At: 2 * sec, Op: SlotExtend, Permit: "a", Want: held(true, 1), Expires: 5 * sec},
			{At: 4 * sec, Permit: "b", Want: full(1, 1*sec)},
			{At: 4 * sec, Op: SlotExtend, Permit: "a", Want: held(true, 1), Expires: 7 * sec},
			// A clock stepped back never shortens a permit.
			{At: 1 * sec, Op: SlotExtend, Permit: "a", Want: held(true, 1), Expires: 7 * sec},
			{At: 7 * sec, Op: SlotExtend, Permit: "a", Want: held(false, 0)},
			{At: 7 * sec, Permit: "b", Want: held(true, 1), Expires: 10 * sec},
		}},
	}
}

// NewSlotStore returns newStore's store as a slot.Store, or skips t
// when the store keeps no concurrency limits.
func slotStore(t *testing.T, newStore NewStore, clock *Clock) floodgate.Store {
	t.Helper()
	st := newStore(t, clock)
	t.Cleanup(func() { st.Close() })
	if _, ok := st.(slot.Store); !ok {
		t.Skipf("the store (%T) keeps no concurrency limits", st)
	}
	return st
}

// RunSlotScenario runs sc on a fresh store from newStore and fails t at
// the first result that differs from the scenario's.
func RunSlotScenario(t *testing.T, newStore NewStore, sc SlotScenario) {
	t.Helper()
	clock := NewClock(Base)
	st := slotStore(t, newStore, clock)
	c, err := floodgate.NewConcurrency(st, sc.N, sc.Lease, &floodgate.ConcurrencyOptions{Name: sc.Name})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	permits := map[string]floodgate.Permit{}
	for i, s := range sc.Steps {
		clock.Set(Base.Add(s.At))
		key := s.Key
		if key == "" {
			key = "k"
		}
		var got floodgate.SlotResult
		switch s.Op {
		case SlotAcquire:
			got, err = c.Acquire(ctx, key)
			if got.Allowed {
				permits[s.Permit] = got.Permit
			}
		case SlotRelease:
			got, err = c.Release(ctx, permits[s.Permit])
		case SlotExtend:
			got, err = c.Extend(ctx, permits[s.Permit])
		}
		if err != nil {
			t.Fatalf("step %d (%s at %s): %v", i, s.Permit, s.At, err)
		}
		want := s.Want
		want.Limit, want.Name = sc.N, sc.Name
		if s.Expires != 0 {
			want.Permit = floodgate.Permit{Key: key, ID: permits[s.Permit].ID, Expires: Base.Add(s.Expires)}
		}
		if !got.Permit.Expires.Equal(want.Permit.Expires) {
			t.Fatalf("step %d (%s at %s): expires %s, want %s", i, s.Permit, s.At,
				got.Permit.Expires.Sub(Base), want.Permit.Expires.Sub(Base))
		}
		got.Permit.Expires = want.Permit.Expires
		if got != want {
			t.Fatalf("step %d (%s at %s):\n got %+v\nwant %+v", i, s.Permit, s.At, got, want)
		}
		checkInspect(t, c, key, want, fmt.Sprintf("step %d (%s at %s)", i, s.Permit, s.At))
	}
}

// checkInspect checks that a look at key's slots, right after a step
// whose result is want, tells the same: the permits held, and for a
// denied acquire when the next slot frees. A store whose slots cannot be
// inspected passes.
func checkInspect(t *testing.T, c *floodgate.Concurrency, key string, want floodgate.SlotResult, step string) {
	t.Helper()
	in, err := c.Inspect(context.Background(), key)
	if errors.Is(err, errors.ErrUnsupported) {
		return
	}
	if err != nil {
		t.Fatalf("%s: inspect: %v", step, err)
	}
	if in.Held != want.Held || in.Limit != want.Limit || in.Source != floodgate.SourceStore {
		t.Fatalf("%s: inspect: %+v, want %d of %d held, from the store", step, in, want.Held, want.Limit)
	}
	if want.RetryAfter > 0 && in.FreeAfter != want.RetryAfter {
		t.Fatalf("%s: inspect: a slot frees in %s, want %s", step, in.FreeAfter, want.RetryAfter)
	}
	if (in.Held == 0) != (in.FreeAfter == 0) || (in.Held == 0) != in.Earliest.IsZero() {
		t.Fatalf("%s: inspect: %+v: FreeAfter and Earliest are set when, and only when, a permit is held", step, in)
	}
}

// runSlotInspect checks Concurrency.Inspect: a fresh key holds nothing,
// the earliest expiry is the earliest live permit's, an expired permit is
// not counted, a bad key is an error, and a look changes nothing.
func runSlotInspect(t *testing.T, newStore NewStore) {
	clock := NewClock(Base)
	st := slotStore(t, newStore, clock)
	c, err := floodgate.NewConcurrency(st, 3, 10*sec, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	in, err := c.Inspect(ctx, "k")
	if errors.Is(err, errors.ErrUnsupported) {
		t.Skip(err)
	}
	if err != nil || in.Held != 0 || in.Limit != 3 || in.FreeAfter != 0 || !in.Earliest.IsZero() {
		t.Fatalf("fresh key: %+v %v", in, err)
	}
	if _, err := c.Inspect(ctx, ""); !errors.Is(err, floodgate.ErrInvalidKey) {
		t.Errorf("empty key: %v", err)
	}
	for _, at := range []time.Duration{0, 2 * sec, 4 * sec} {
		clock.Set(Base.Add(at))
		if r, err := c.Acquire(ctx, "k"); err != nil || !r.Allowed {
			t.Fatal(r, err)
		}
	}
	for _, tc := range []struct {
		at        time.Duration
		held      int64
		freeAfter time.Duration
	}{
		{5 * sec, 3, 5 * sec},
		{10 * sec, 2, 2 * sec}, // the first expired at 10s: [0, 10s)
		{12*sec + us, 1, 2*sec - us},
		{14 * sec, 0, 0},
		// The clock steps back: the permits were not dropped by a look.
		{5 * sec, 3, 5 * sec},
	} {
		clock.Set(Base.Add(tc.at))
		in, err := c.Inspect(ctx, "k")
		if err != nil || in.Held != tc.held || in.FreeAfter != tc.freeAfter {
			t.Fatalf("at %s: %+v %v, want %d held, free after %s", tc.at, in, err, tc.held, tc.freeAfter)
		}
		if tc.held > 0 && !in.Earliest.Equal(Base.Add(tc.at+tc.freeAfter)) {
			t.Fatalf("at %s: earliest %s", tc.at, in.Earliest.Sub(Base))
		}
	}
}

// RunSlots runs the concurrency limit section of the suite: the
// scenarios, bad input, groups all or nothing, and many goroutines on
// one key. A store that does not implement slot.Store skips it.
func RunSlots(t *testing.T, newStore NewStore) {
	for _, sc := range SlotScenarios() {
		t.Run(sc.Name, func(t *testing.T) {
			t.Parallel()
			RunSlotScenario(t, newStore, sc)
		})
	}
	t.Run("errors", func(t *testing.T) { runSlotErrors(t, newStore) })
	t.Run("group", func(t *testing.T) { runSlotGroup(t, newStore) })
	t.Run("goroutines", func(t *testing.T) { runSlotGoroutines(t, newStore) })
	t.Run("inspect", func(t *testing.T) { runSlotInspect(t, newStore) })
}

func runSlotErrors(t *testing.T, newStore NewStore) {
	st := slotStore(t, newStore, NewClock(Base))
	for _, tc := range []struct {
		n     int64
		lease time.Duration
	}{{0, sec}, {-1, sec}, {floodgate.MaxSlots + 1, sec}, {1, 0}, {1, floodgate.MaxPeriod + us}} {
		if _, err := floodgate.NewConcurrency(st, tc.n, tc.lease, nil); !errors.Is(err, floodgate.ErrInvalidLimit) {
			t.Errorf("NewConcurrency(%d, %s): %v, want ErrInvalidLimit", tc.n, tc.lease, err)
		}
	}
	c, err := floodgate.NewConcurrency(st, 1, sec, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	r, err := c.Acquire(ctx, "k")
	if err != nil || !r.Allowed {
		t.Fatal(r, err)
	}
	p := r.Permit
	if len(p.ID) != floodgate.PermitIDLen {
		t.Errorf("permit id %q", p.ID)
	}
	for _, tc := range []struct {
		name string
		p    floodgate.Permit
		want error
	}{
		{"another key's permit", floodgate.Permit{Key: "k2", ID: p.ID}, floodgate.ErrInvalidPermit},
		{"oversize id", floodgate.Permit{Key: "k", ID: strings.Repeat("0", 10000)}, floodgate.ErrInvalidPermit},
		{"forged id", floodgate.Permit{Key: "k", ID: "../../etc"}, floodgate.ErrInvalidPermit},
		{"empty id", floodgate.Permit{Key: "k"}, floodgate.ErrInvalidPermit},
		{"empty key", floodgate.Permit{ID: p.ID}, floodgate.ErrInvalidKey},
		{"long key", floodgate.Permit{Key: strings.Repeat("k", floodgate.MaxKeyLen+1), ID: p.ID}, floodgate.ErrInvalidKey},
	} {
		for _, op := range []func(context.Context, floodgate.Permit) (floodgate.SlotResult, error){c.Release, c.Extend} {
			if _, err := op(ctx, tc.p); !errors.Is(err, tc.want) {
				t.Errorf("%s: %v, want %v", tc.name, err, tc.want)
			}
		}
	}
	if _, err := c.Acquire(ctx, ""); !errors.Is(err, floodgate.ErrInvalidKey) {
		t.Errorf("acquire on an empty key: %v", err)
	}
	// An acquire naming a permit that is held already is an error
	// (slot.Spec.Step), on a full key as on one with room: a store
	// that checked the room first would deny it on a full key instead.
	spec, err := slot.New(1, sec)
	if err != nil {
		t.Fatal(err)
	}
	pol, err := st.(slot.Store).PrepareSlots(spec)
	if err != nil {
		t.Fatal(err)
	}
	if v, _, err := pol.Slot(ctx, p.Key, slot.Op{Kind: slot.Acquire, ID: p.ID}); !errors.Is(err, floodgate.ErrInvalidPermit) {
		t.Errorf("acquire of the held permit on a full key: %+v %v, want ErrInvalidPermit", v, err)
	}
	// Nothing above changed the key: the permit is still held, once.
	if r, err := c.Release(ctx, p); err != nil || !r.Allowed || r.Held != 0 {
		t.Errorf("release after the bad calls: %+v %v", r, err)
	}
}

// runSlotGroup checks AcquireGroup: a concurrency limit and rate limits,
// on the same key and on others, pass together or charge nothing.
func runSlotGroup(t *testing.T, newStore NewStore) {
	clock := NewClock(Base)
	st := slotStore(t, newStore, clock)
	ctx := context.Background()
	c, err := floodgate.NewConcurrency(st, 2, 10*sec, nil)
	if err != nil {
		t.Fatal(err)
	}
	perKey, err := floodgate.NewLimiter(st, []floodgate.Limit{floodgate.FixedWindow(3, time.Minute)}, nil)
	if err != nil {
		t.Fatal(err)
	}
	tenant, err := floodgate.NewLimiter(st, []floodgate.Limit{floodgate.FixedWindow(2, time.Minute)}, nil)
	if err != nil {
		t.Fatal(err)
	}
	group := func(key string) []floodgate.Request {
		return []floodgate.Request{{Limiter: perKey, Key: key, N: 1}, {Limiter: tenant, Key: "tenant", N: 1}}
	}
	remaining := func(l *floodgate.Limiter, key string) int64 {
		r, err := l.AllowN(ctx, key, 0)
		if err != nil {
			t.Fatal(err)
		}
		return r.Remaining
	}
	check := func(step string, slots, key, tenantLeft int64) {
		t.Helper()
		if got := remaining(perKey, "k"); got != key {
			t.Errorf("%s: the key's rate limit has %d left, want %d", step, got, key)
		}
		if got := remaining(tenant, "tenant"); got != tenantLeft {
			t.Errorf("%s: the tenant's rate limit has %d left, want %d", step, got, tenantLeft)
		}
		// A peek at the slots: acquire and release at once.
		r, err := c.Acquire(ctx, "k")
		if err != nil {
			t.Fatal(err)
		}
		h := r.Held
		if r.Allowed {
			h--
			if _, err := c.Release(ctx, r.Permit); err != nil {
				t.Fatal(err)
			}
		}
		if h != slots {
			t.Errorf("%s: %d slots held, want %d", step, h, slots)
		}
	}
	reqs := group("k")
	r1, err := floodgate.AcquireGroup(ctx, c, "k", reqs)
	if err != nil || !r1.Allowed || !reqs[0].Result.Allowed || !reqs[1].Result.Allowed {
		t.Fatalf("first: %+v %+v %v", r1, reqs, err)
	}
	check("after the first", 1, 2, 1)
	reqs = group("k")
	if r, err := floodgate.AcquireGroup(ctx, c, "k", reqs); err != nil || !r.Allowed {
		t.Fatalf("second: %+v %v", r, err)
	}
	check("after the second", 2, 1, 0)
	// The slots are full: no rate limit is charged.
	if r, err := floodgate.AcquireGroup(ctx, c, "k", group("k")); err != nil || r.Allowed || r.Held != 2 || r.RetryAfter != 10*sec {
		t.Fatalf("third, slots full: %+v %v", r, err)
	}
	check("after slots denied", 2, 1, 0)
	if _, err := c.Release(ctx, r1.Permit); err != nil {
		t.Fatal(err)
	}
	// A slot is free, but the tenant's rate limit denies: the slot is
	// given back and the key's rate limit refunded.
	reqs = group("k")
	r, err := floodgate.AcquireGroup(ctx, c, "k", reqs)
	if err != nil || r.Allowed || r.Held != 1 || reqs[1].Result.Allowed || reqs[0].Result.Allowed {
		t.Fatalf("fourth, rate denied: %+v %+v %v", r, reqs, err)
	}
	check("after rate denied", 1, 1, 0)
}

// runSlotGoroutines has goroutines acquire and release on one key, each
// recording that it holds a slot, and checks that no more than N hold
// one at once, that every slot comes back, and that every acquire that
// finds fewer than N held succeeds.
func runSlotGoroutines(t *testing.T, newStore NewStore) {
	st := slotStore(t, newStore, NewClock(Base))
	const n, workers, rounds = 3, 16, 20
	c, err := floodgate.NewConcurrency(st, n, time.Hour, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	var holding, most, granted atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < rounds; i++ {
				r, err := c.Acquire(ctx, "hot")
				if err != nil {
					errs <- err
					return
				}
				if !r.Allowed {
					if r.Held != n {
						errs <- fmt.Errorf("denied with %d held", r.Held)
						return
					}
					continue
				}
				granted.Add(1)
				h := holding.Add(1)
				for m := most.Load(); h > m && !most.CompareAndSwap(m, h); m = most.Load() {
				}
				holding.Add(-1)
				rel, err := c.Release(ctx, r.Permit)
				if err != nil || !rel.Allowed {
					errs <- fmt.Errorf("release: %+v %v", rel, err)
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if most.Load() > n || granted.Load() == 0 {
		t.Fatalf("%d held at once (limit %d), %d granted", most.Load(), n, granted.Load())
	}
	r, err := c.Acquire(ctx, "hot")
	if err != nil || !r.Allowed || r.Held != 1 {
		t.Fatalf("after every release: %+v %v", r, err)
	}
}
