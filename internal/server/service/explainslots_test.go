package service_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/floodgate/floodgate"
	"github.com/floodgate/floodgate/fallback"
	"github.com/floodgate/floodgate/internal/server/service"
	"github.com/floodgate/floodgate/internal/testkit/redistest"
	"github.com/floodgate/floodgate/redisstore"
	"github.com/floodgate/floodgate/storetest"
)

// Explain of a concurrency rule, on the memory store and on Redis: the
// slots held and when the earliest frees, the rate rules an acquire
// decides with them, what answers; and a look takes no slot.
func TestExplainConcurrency(t *testing.T) {
	stores := map[string]func(t *testing.T, clock floodgate.Clock) floodgate.Store{
		"memory": func(t *testing.T, clock floodgate.Clock) floodgate.Store {
			return floodgate.NewMemoryStore(&floodgate.MemoryOptions{Clock: clock, SweepInterval: -1})
		},
		"redis": func(t *testing.T, clock floodgate.Clock) floodgate.Store {
			return redisstore.New(redistest.Start(t).Client(t), &redisstore.Options{Clock: clock})
		},
	}
	for name, newStore := range stores {
		t.Run(name, func(t *testing.T) {
			ctx := context.Background()
			clock := storetest.NewClock(storetest.Base)
			st := newStore(t, clock)
			t.Cleanup(func() { st.Close() })
			svc := newServiceOn(t, st, slotRules)
			at := func(d time.Duration) { clock.Set(storetest.Base.Add(d)) }
			acquire := func(rule string) {
				t.Helper()
				if d, err := svc.Acquire(ctx, rule, "k"); err != nil || !d.Result.Allowed {
					t.Fatal(d, err)
				}
			}
			type want struct {
				slots, held int64
				freeIn      *int64 // ms; nil: none held
				rates       int
				allowed     bool
				why         []string
			}
			explain := func(step, rule string, w want) {
				t.Helper()
				for round := range 2 { // the second sees what the first did: nothing
					e, err := svc.Explain(ctx, rule, "k")
					if err != nil {
						t.Fatalf("%s: %v", step, err)
					}
					c := e.Concurrency
					if c == nil || e.Rule != rule || len(e.Limits) != 0 || e.Decides != -1 {
						t.Fatalf("%s, round %d: %+v", step, round, e)
					}
					if c.Slots != w.slots || c.Held != w.held || (c.FreeInMs == nil) != (w.freeIn == nil) || (w.freeIn != nil && *c.FreeInMs != *w.freeIn) ||
						len(c.Rates) != w.rates || e.Allowed != w.allowed {
						t.Fatalf("%s, round %d: %+v (free in %v), allowed %v; want %+v", step, round, c, c.FreeInMs, e.Allowed, w)
					}
					if e.Store.Name != name || e.Store.Source != "store" {
						t.Errorf("%s: store %+v", step, e.Store)
					}
					why := strings.Join(e.Why, "\n")
					for _, s := range w.why {
						if !strings.Contains(why, s) {
							t.Errorf("%s, round %d: why lacks %q:\n%s", step, round, s, why)
						}
					}
				}
			}
			explain("fresh", "llm", want{slots: 2, allowed: true, why: []string{
				`key "k" is checked against concurrency rule "llm": 2 slots, each permit held until released, or for a lease of 30s unless extended`,
				"0 of 2 slots are held now", "an acquire would get a slot"}})
			acquire("llm")
			at(5 * time.Second)
			acquire("llm")
			at(10 * time.Second)
			explain("full", "llm", want{slots: 2, held: 2, freeIn: ms(20000), why: []string{
				"2 of 2 slots are held now; the earliest permit expires in 20s: a slot frees then at the latest",
				"an acquire would be denied: all 2 slots are held"}})
			at(30 * time.Second) // the first expires: [0, 30s)
			explain("one expired", "llm", want{slots: 2, held: 1, freeIn: ms(5000), allowed: true})

			explain("with a rate rule", "export", want{slots: 5, rates: 1, allowed: true, why: []string{
				`an acquire decides rate rule "api" with the slot, all or nothing`,
				`rate rule "api": a check of cost 1 would be allowed`}})
			acquire("export")
			acquire("export")
			explain("rate rule spent", "export", want{slots: 5, held: 2, freeIn: ms(60000), rates: 1, why: []string{
				`rate rule "api": a check of cost 1 would be denied by limit 0`,
				"an acquire would be denied by a rate rule, and would hold no slot"}})
		})
	}
}

func TestExplainConcurrencyBadInput(t *testing.T) {
	st := floodgate.NewMemoryStore(&floodgate.MemoryOptions{SweepInterval: -1})
	t.Cleanup(func() { st.Close() })
	svc := newServiceOn(t, st, slotRules)
	for _, key := range []string{"", strings.Repeat("k", service.MaxKeyLen+1)} {
		if _, err := svc.Explain(context.Background(), "llm", key); !errors.Is(err, service.ErrBadRequest) {
			t.Errorf("key of %d bytes: %v", len(key), err)
		}
	}
}

// A concurrency rule behind the fallback: Redis answers while it is up,
// the local share when it is down, with the local permits beside it.
func TestExplainConcurrencyFallback(t *testing.T) {
	ctx := context.Background()
	svc, srv := newFallbackService(t, slotRules)
	if d, err := svc.Acquire(ctx, "llm", "k"); err != nil || !d.Result.Allowed {
		t.Fatal(d, err)
	}
	e, err := svc.Explain(ctx, "llm", "k")
	if err != nil {
		t.Fatal(err)
	}
	if c, st := e.Concurrency, e.Store; c.Held != 1 || c.Slots != 2 || st.Source != "store" || st.Fallback == nil || st.Fallback.Degraded || c.Local == nil || c.Local.Slots != 1 || c.Local.Held != 0 {
		t.Fatalf("Redis up: %+v, local %+v, store %+v", c, c.Local, st)
	}
	srv.Stop()
	// The first acquire finds Redis down and takes the local share.
	if d, err := svc.Acquire(ctx, "llm", "k"); err != nil || !d.Result.Allowed || d.Result.Source != floodgate.SourceLocal {
		t.Fatal(d, err)
	}
	e, err = svc.Explain(ctx, "llm", "k")
	if err != nil {
		t.Fatal(err)
	}
	if c, st := e.Concurrency, e.Store; c.Held != 1 || c.Slots != 1 || e.Allowed || st.Source != "local" || !st.Fallback.Degraded || c.Local.Held != 1 {
		t.Fatalf("Redis down: %+v, local %+v, store %+v", c, c.Local, st)
	}
	why := strings.Join(e.Why, "\n")
	for _, s := range []string{"1 of 1 slots are held now", "Redis is failing for this key", "this instance's local store holds 1 of its 1 slots on the key"} {
		if !strings.Contains(why, s) {
			t.Errorf("Redis down: why lacks %q:\n%s", s, why)
		}
	}
}

// In the fail-open mode, explain shows the permits this instance granted
// open while Redis failed, which Redis does not count, and not as a local
// store's share: the mode has none.
func TestExplainConcurrencyFailOpen(t *testing.T) {
	ctx := context.Background()
	svc, srv := newFallbackService(t, slotRules, fallback.FailOpen)
	srv.Stop()
	for range 3 {
		if d, err := svc.Acquire(ctx, "llm", "k"); err != nil || !d.Result.Allowed || d.Result.Source != floodgate.SourceFailOpen {
			t.Fatal(d, err)
		}
	}
	e, err := svc.Explain(ctx, "llm", "k")
	if err != nil {
		t.Fatal(err)
	}
	c := e.Concurrency
	if c.Local != nil || c.FailOpen == nil || c.FailOpen.Held != 3 || c.FailOpen.FreeInMs == nil || !e.Store.Fallback.Degraded {
		t.Fatalf("Redis down, fail open: %+v, local %+v, fail open %+v, store %+v", c, c.Local, c.FailOpen, e.Store)
	}
	why := strings.Join(e.Why, "\n")
	if !strings.Contains(why, "this instance granted 3 permits on the key while Redis failed (fail open), which Redis does not count") {
		t.Errorf("why lacks the fail-open permits:\n%s", why)
	}
	if strings.Contains(why, "local store") {
		t.Errorf("why names a local store, which fail open has not:\n%s", why)
	}
}
