package fallback_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/floodgate/floodgate"
	"github.com/floodgate/floodgate/core"
	"github.com/floodgate/floodgate/core/slot"
	"github.com/floodgate/floodgate/fallback"
	"github.com/floodgate/floodgate/storetest"
	"go.uber.org/goleak"
)

// mode is how a flaky store behaves.
type mode int32

const (
	healthy mode = iota
	failing      // returns an error wrapping ErrStore at once
	hanging      // blocks until the context ends
	landing      // a slot acquire is applied, then fails, as on a server that ran it after the caller gave up; other slot ops fail
)

// flaky is a floodgate.Store over the memory store whose failures the test
// switches on and off. It is a stand-in for a primary store in the unit
// tests; the fault tests use a real redis-server.
type flaky struct {
	floodgate.Store
	mode  atomic.Int32
	calls atomic.Int64
	// answered, when set, runs after each Take the store answers.
	answered func()
	// poisoned, when set, is a key whose calls fail with ErrKey while
	// the store is healthy, as a key holding foreign data in Redis does.
	poisoned atomic.Pointer[string]
	// slotGate, when set, runs before each slot op while the store is
	// healthy, and fails the op when it returns an error. Set it only
	// while no op is in flight.
	slotGate func(ctx context.Context, op slot.Op) error
}

// keyFailure returns the error of a call on key: ErrKey when key is the
// poisoned one.
func (f *flaky) keyFailure(key string) error {
	if k := f.poisoned.Load(); k != nil && *k == key {
		return fmt.Errorf("%w: redis: wrong type: key %s holds a value that is not floodgate state", floodgate.ErrKey, key)
	}
	return nil
}

func (f *flaky) Prepare(limits []core.Spec) (core.Policy, error) {
	p, err := f.Store.Prepare(limits)
	if err != nil {
		return nil, err
	}
	return &flakyPolicy{f: f, Policy: p}, nil
}

// flakyPolicy is a policy of a flaky store: it fails as the store says.
type flakyPolicy struct {
	f *flaky
	core.Policy
}

// fail counts a call and fails it as the store's mode says.
func (p *flakyPolicy) fail(ctx context.Context) error {
	p.f.calls.Add(1)
	switch mode(p.f.mode.Load()) {
	case failing:
		return floodgate.ErrStore
	case hanging:
		<-ctx.Done()
		return ctx.Err()
	}
	return nil
}

func (p *flakyPolicy) Take(ctx context.Context, key string, n int64) (core.Decision, error) {
	if err := p.fail(ctx); err != nil {
		return core.Decision{}, err
	}
	if err := p.f.keyFailure(key); err != nil {
		return core.Decision{}, err
	}
	d, err := p.Policy.Take(ctx, key, n)
	if p.f.answered != nil {
		p.f.answered()
	}
	return d, err
}

func (p *flakyPolicy) Charge(ctx context.Context, key string, n int64) (core.Decision, error) {
	if err := p.fail(ctx); err != nil {
		return core.Decision{}, err
	}
	if err := p.f.keyFailure(key); err != nil {
		return core.Decision{}, err
	}
	return p.Policy.Charge(ctx, key, n)
}

func (p *flakyPolicy) Refund(ctx context.Context, key string, n int64) (core.Decision, error) {
	if err := p.fail(ctx); err != nil {
		return core.Decision{}, err
	}
	return p.Policy.Refund(ctx, key, n)
}

// gateClock is a fixed clock whose Sleep blocks until the test calls tick,
// so the probe loop runs one probe per tick.
type gateClock struct {
	*storetest.Clock
	ticks chan struct{}
	slept chan struct{}
}

func newGateClock() *gateClock {
	return &gateClock{Clock: storetest.NewClock(storetest.Base), ticks: make(chan struct{}), slept: make(chan struct{}, 16)}
}

func (c *gateClock) Sleep(ctx context.Context, d time.Duration) error {
	select {
	case c.slept <- struct{}{}:
	default:
	}
	select {
	case <-c.ticks:
		c.Advance(d)
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// tick lets one sleeping probe loop run one probe, and waits until it is
// asleep again (or gone).
func (c *gateClock) tick(t *testing.T) {
	t.Helper()
	select {
	case c.ticks <- struct{}{}:
	case <-time.After(5 * time.Second):
		t.Fatal("no probe loop is waiting")
	}
}

type fixture struct {
	clock   *gateClock
	primary *flaky
	store   *fallback.Store
	log     *bytes.Buffer
	states  chan fallback.State
}

func newFixture(t *testing.T, o fallback.Options) *fixture {
	t.Helper()
	f := &fixture{clock: newGateClock(), log: &bytes.Buffer{}, states: make(chan fallback.State, 16)}
	f.primary = &flaky{Store: floodgate.NewMemoryStore(&floodgate.MemoryOptions{Clock: f.clock, SweepInterval: -1})}
	o.Clock = f.clock
	o.Logger = slog.New(slog.NewTextHandler(&lockedWriter{w: f.log}, nil))
	o.OnSwitch = func(s fallback.State) { f.states <- s }
	if o.Budget == 0 {
		o.Budget = 20 * time.Millisecond
	}
	f.store = fallback.New(f.primary, &o)
	t.Cleanup(func() {
		f.store.Close()
		f.primary.Store.Close()
	})
	return f
}

// next returns the next switch, failing the test when none comes within
// five seconds.
func (f *fixture) next(t *testing.T) fallback.State {
	t.Helper()
	select {
	case st := <-f.states:
		return st
	case <-time.After(5 * time.Second):
		t.Fatalf("no switch; State %v", f.store.State())
	}
	return 0
}

type lockedWriter struct {
	mu sync.Mutex
	w  *bytes.Buffer
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

// go-redis retries a dial to a dead Cluster node from a goroutine of its
// pool that sleeps a second between tries and ends at the next, once the
// client is closed.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, goleak.IgnoreAnyFunction("github.com/redis/go-redis/v9/internal/pool.(*ConnPool).tryDial"))
}

// A healthy primary decides everything: the wrapper passes the whole
// conformance suite.
func TestConformance(t *testing.T) {
	storetest.Run(t, func(t *testing.T, clock floodgate.Clock) floodgate.Store {
		primary := floodgate.NewMemoryStore(&floodgate.MemoryOptions{Clock: clock, SweepInterval: -1})
		t.Cleanup(func() { primary.Close() })
		return fallback.New(primary, &fallback.Options{Clock: clock, Budget: -1})
	})
}

func TestPolicies(t *testing.T) {
	limits := []floodgate.Limit{floodgate.TokenBucket(10, time.Second, 8)}
	tests := []struct {
		policy    fallback.Mode
		instances int64
		source    floodgate.Source
		allowed   int // of 20 requests at one instant
	}{
		{fallback.Local, 1, floodgate.SourceLocal, 8},
		{fallback.Local, 4, floodgate.SourceLocal, 2},
		{fallback.Local, 100, floodgate.SourceLocal, 1}, // a share is at least 1
		{fallback.FailOpen, 1, floodgate.SourceFailOpen, 20},
		{fallback.FailClosed, 1, floodgate.SourceFailClosed, 0},
	}
	for _, tt := range tests {
		t.Run(tt.policy.String(), func(t *testing.T) {
			f := newFixture(t, fallback.Options{Mode: tt.policy, Instances: tt.instances, Threshold: 1000})
			lim := limiter(t, f.store, limits...)
			f.primary.mode.Store(int32(failing))
			allowed := 0
			for range 20 {
				r, err := lim.AllowN(context.Background(), "k", 1)
				if err != nil {
					t.Fatalf("Take: %v", err)
				}
				if r.Source != tt.source {
					t.Fatalf("Source = %v, want %v", r.Source, tt.source)
				}
				if r.Allowed {
					allowed++
				} else if r.RetryAfter <= 0 {
					t.Fatalf("denial without RetryAfter: %+v", r)
				}
			}
			if allowed != tt.allowed {
				t.Errorf("allowed %d of 20, want %d", allowed, tt.allowed)
			}
			if got := f.store.Stats().Fallbacks; got != 20 {
				t.Errorf("Stats().Fallbacks = %d, want 20", got)
			}
		})
	}
}

func TestParseMode(t *testing.T) {
	for _, p := range []fallback.Mode{fallback.Local, fallback.FailOpen, fallback.FailClosed} {
		got, err := fallback.ParseMode(p.String())
		if err != nil || got != p {
			t.Errorf("ParseMode(%q) = %v, %v", p.String(), got, err)
		}
	}
	if _, err := fallback.ParseMode("open"); err == nil {
		t.Error("ParseMode(open) succeeded")
	}
}

// A hung primary costs each caller the budget, no more, and the decision
// comes from the fallback: with no deadline of the caller's, or one later
// than the budget.
func TestBudget(t *testing.T) {
	for _, tt := range []struct {
		name     string
		deadline time.Duration // the caller's; 0 for none
	}{
		{"no deadline", 0},
		{"a later deadline", time.Hour},
	} {
		t.Run(tt.name, func(t *testing.T) {
			f := newFixture(t, fallback.Options{Budget: 5 * time.Millisecond, Threshold: 1000})
			f.primary.mode.Store(int32(hanging))
			ctx := context.Background()
			if tt.deadline > 0 {
				var cancel context.CancelFunc
				ctx, cancel = context.WithTimeout(ctx, tt.deadline)
				defer cancel()
			}
			r, err := limiter(t, f.store, floodgate.PerSecond(5)).AllowN(ctx, "k", 1)
			if err != nil || !r.Allowed || r.Source != floodgate.SourceLocal {
				t.Fatalf("Take on a hung primary = %+v, %v; want allowed by the local limiter", r, err)
			}
			if got := f.store.Stats().Failures; got != 1 {
				t.Errorf("Failures = %d, want 1", got)
			}
		})
	}
}

// The caller's own cancellation or deadline is returned as it is and is
// not counted against the primary.
func TestCallerCancellation(t *testing.T) {
	f := newFixture(t, fallback.Options{Budget: time.Hour, Threshold: 1})
	f.primary.mode.Store(int32(hanging))
	limits := []floodgate.Limit{floodgate.PerSecond(5)}
	lim := limiter(t, f.store, limits...)

	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := lim.AllowN(ctx, "k", 1); !errors.Is(err, context.Canceled) {
		t.Errorf("cancelled: err = %v, want context.Canceled", err)
	}
	ctx, cancel = context.WithTimeout(context.Background(), time.Millisecond)
	defer cancel()
	if _, err := lim.AllowN(ctx, "k", 1); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("deadline: err = %v, want context.DeadlineExceeded", err)
	}
	if s := f.store.Stats(); s.Failures != 0 || f.store.State() != fallback.Primary {
		t.Errorf("a caller's cancellation counted as a failure: %+v, state %v", s, f.store.State())
	}
}

// A decision of the primary reaches the local store even when its caller's
// context ends as the answer comes back (an Envoy deadline, say): the
// primary charged it, so after a switch the local store must not admit it
// again.
func TestSyncOutlivesCaller(t *testing.T) {
	f := newFixture(t, fallback.Options{Threshold: 1})
	lim := limiter(t, f.store, floodgate.FixedWindow(5, time.Minute))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	f.primary.answered = cancel
	if r, err := lim.AllowN(ctx, "k", 3); err != nil || !r.Allowed {
		t.Fatalf("AllowN: %+v, %v", r, err)
	}
	f.primary.answered = nil
	f.primary.mode.Store(int32(failing))
	r, err := lim.AllowN(context.Background(), "k", 3)
	if err != nil {
		t.Fatal(err)
	}
	if r.Allowed || r.Remaining != 2 || r.Source != floodgate.SourceLocal {
		t.Errorf("local answer after the switch: %+v, want denied with 2 left, from the local store", r)
	}
}

// Invalid input is the caller's error, whatever the primary's health.
func TestInputErrors(t *testing.T) {
	f := newFixture(t, fallback.Options{})
	f.primary.mode.Store(int32(failing))
	if _, err := limiter(t, f.store, floodgate.PerSecond(1)).AllowN(context.Background(), "", 1); !errors.Is(err, floodgate.ErrInvalidKey) {
		t.Errorf("empty key: %v", err)
	}
	if _, err := floodgate.NewLimiter(f.store, []floodgate.Limit{floodgate.PerSecond(0)}, nil); !errors.Is(err, floodgate.ErrInvalidLimit) {
		t.Errorf("zero rate: %v", err)
	}
	if f.primary.calls.Load() != 0 {
		t.Error("invalid input reached the primary")
	}
}

// The breaker opens after Threshold failures in a row, stops calling the
// primary, probes it from one loop, and closes on the first good probe.
func TestBreaker(t *testing.T) {
	f := newFixture(t, fallback.Options{Threshold: 3})
	limits := []floodgate.Limit{floodgate.PerSecond(1000)}
	lim := limiter(t, f.store, limits...)
	take := func() floodgate.Result {
		t.Helper()
		r, err := lim.AllowN(context.Background(), "k", 1)
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	if r := take(); r.Source != floodgate.SourceStore {
		t.Fatalf("healthy: Source = %v", r.Source)
	}
	f.primary.mode.Store(int32(failing))
	for range 3 {
		if r := take(); r.Source != floodgate.SourceLocal {
			t.Fatalf("failing: Source = %v", r.Source)
		}
	}
	if got := <-f.states; got != fallback.Degraded || f.store.State() != fallback.Degraded {
		t.Fatalf("after 3 failures: switched to %v, State %v", got, f.store.State())
	}
	calls := f.primary.calls.Load()
	for range 100 {
		take()
	}
	if got := f.primary.calls.Load(); got != calls {
		t.Fatalf("open breaker sent %d decisions to the primary", got-calls)
	}

	<-f.clock.slept // the probe loop waits for its first tick
	f.clock.tick(t) // a failing probe
	<-f.clock.slept
	if f.store.State() != fallback.Degraded || f.primary.calls.Load() != calls+1 {
		t.Fatalf("after a failed probe: state %v, %d probe calls", f.store.State(), f.primary.calls.Load()-calls)
	}
	f.primary.mode.Store(int32(healthy))
	f.clock.tick(t) // a good probe closes the breaker
	if got := <-f.states; got != fallback.Primary {
		t.Fatalf("after a good probe: switched to %v", got)
	}
	if r := take(); r.Source != floodgate.SourceStore {
		t.Fatalf("recovered: Source = %v", r.Source)
	}
	s := f.store.Stats()
	if s.Switches != 2 || s.Probes != 2 || s.Failures != 4 {
		t.Errorf("Stats = %+v, want 2 switches, 2 probes, 4 failures", s)
	}
	log := f.log.String()
	if !strings.Contains(log, "level=WARN") || !strings.Contains(log, "primary store failing") || !strings.Contains(log, "recovered") {
		t.Errorf("log lines missing:\n%s", log)
	}
}

// An error about one key (ErrKey) goes back to its caller and is never a
// failure of the primary: many in a row leave the breaker closed, and
// the other keys with the primary.
func TestKeyErrorsKeepBreakerClosed(t *testing.T) {
	for _, p := range []fallback.Mode{fallback.Local, fallback.FailOpen, fallback.FailClosed} {
		t.Run(p.String(), func(t *testing.T) {
			f := newFixture(t, fallback.Options{Threshold: 3, Mode: p})
			lim := limiter(t, f.store, floodgate.PerSecond(1000))
			bad := "poisoned"
			f.primary.poisoned.Store(&bad)
			for i := range 10 {
				r, err := lim.AllowN(context.Background(), bad, 1)
				if !errors.Is(err, floodgate.ErrKey) || !strings.Contains(err.Error(), "wrong type") {
					t.Fatalf("decision %d on the poisoned key: %+v, %v; want its ErrKey", i, r, err)
				}
			}
			if r, err := lim.AllowN(context.Background(), "good", 1); err != nil || r.Source != floodgate.SourceStore {
				t.Fatalf("another key: %+v, %v; want the primary's decision", r, err)
			}
			if len(f.states) != 0 || f.store.State() != fallback.Primary {
				t.Fatalf("the breaker switched (%d times), State %v", len(f.states), f.store.State())
			}
			if s := f.store.Stats(); s.Failures != 0 || s.Fallbacks != 0 || s.KeyErrors != 10 {
				t.Errorf("Stats = %+v, want no failures or fallbacks, 10 key errors", s)
			}
		})
	}
}

// A key of the ledger that the primary fails on alone (ErrKey) is dropped
// unsettled when the primary is back: it does not keep the breaker open,
// and the ledger's other keys are settled.
func TestKeyErrorDroppedFromLedger(t *testing.T) {
	f := newFixture(t, fallback.Options{Threshold: 1})
	lim := limiter(t, f.store, floodgate.TokenBucket(10, time.Second, 10))
	ctx := context.Background()
	f.primary.mode.Store(int32(failing))
	for _, key := range []string{"poisoned", "good"} {
		for range 4 {
			if r, err := lim.AllowN(ctx, key, 1); err != nil || r.Source != floodgate.SourceLocal {
				t.Fatalf("%s while the primary fails: %+v, %v", key, r, err)
			}
		}
	}
	if got := f.next(t); got != fallback.Degraded {
		t.Fatalf("switched to %v", got)
	}
	bad := "poisoned"
	f.primary.poisoned.Store(&bad) // its Redis keys were overwritten meanwhile
	f.primary.mode.Store(int32(healthy))
	<-f.clock.slept
	f.clock.tick(t) // a good probe; the ledger's settle fails on "poisoned" alone
	if got := f.next(t); got != fallback.Primary {
		t.Fatalf("after a good probe: switched to %v", got)
	}
	s := f.store.Stats()
	if s.KeyErrors != 1 || s.Settled == 0 {
		t.Errorf("Stats = %+v, want 1 key error, and \"good\" settled", s)
	}
	if r, err := lim.AllowN(ctx, "good", 1); err != nil || r.Source != floodgate.SourceStore {
		t.Errorf("good after the switch: %+v, %v; want the primary's", r, err)
	}
	if log := f.log.String(); !strings.Contains(log, "dropped a key from the ledger") || !strings.Contains(log, "key=poisoned") {
		t.Errorf("no log line names the dropped key:\n%s", log)
	}
}

// A probe key that fails alone (foreign data at it) is the primary
// answering: the probe closes the breaker.
func TestPoisonedProbeKey(t *testing.T) {
	f := newFixture(t, fallback.Options{Threshold: 3})
	probe := "floodgate-probe"
	f.primary.poisoned.Store(&probe)
	f.primary.mode.Store(int32(failing))
	if err := f.store.Probe(context.Background()); err == nil {
		t.Fatal("Probe of a failing primary succeeded")
	}
	if got := f.next(t); got != fallback.Degraded {
		t.Fatalf("switched to %v", got)
	}
	f.primary.mode.Store(int32(healthy))
	<-f.clock.slept
	f.clock.tick(t)
	if got := f.next(t); got != fallback.Primary {
		t.Fatalf("after a probe that failed on its key alone: switched to %v", got)
	}
	if err := f.store.Probe(context.Background()); err != nil || f.store.State() != fallback.Primary {
		t.Fatalf("Probe: %v, State %v", err, f.store.State())
	}
}

// Many callers failing at once open the breaker once and start one probe
// loop; a success between failures resets the count.
func TestBreakerConcurrent(t *testing.T) {
	f := newFixture(t, fallback.Options{Threshold: 5})
	limits := []floodgate.Limit{floodgate.PerSecond(1000)}
	lim := limiter(t, f.store, limits...)
	f.primary.mode.Store(int32(failing))
	var wg sync.WaitGroup
	for range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 50 {
				if _, err := lim.AllowN(context.Background(), "k", 1); err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	if s := f.store.Stats(); s.Switches != 1 {
		t.Fatalf("Switches = %d, want 1", s.Switches)
	}
	if len(f.states) != 1 {
		t.Fatalf("OnSwitch called %d times, want 1", len(f.states))
	}
}

func TestCloseTwice(t *testing.T) {
	f := newFixture(t, fallback.Options{Threshold: 1})
	f.primary.mode.Store(int32(failing))
	lim := limiter(t, f.store, floodgate.PerSecond(1))
	lim.Allow(context.Background(), "k")
	<-f.clock.slept // a probe loop is running
	if err := f.store.Close(); err != nil {
		t.Fatal(err)
	}
	if err := f.store.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := lim.Allow(context.Background(), "k"); !errors.Is(err, floodgate.ErrClosed) {
		t.Errorf("Take after Close: %v", err)
	}
}

var limiter = storetest.Limiter

// Probe checks the primary at once: a failure opens the breaker without
// waiting for Threshold failed decisions.
func TestProbe(t *testing.T) {
	f := newFixture(t, fallback.Options{Threshold: 3})
	if err := f.store.Probe(context.Background()); err != nil || f.store.State() != fallback.Primary {
		t.Fatalf("healthy: %v, %v", err, f.store.State())
	}
	f.primary.mode.Store(int32(failing))
	if err := f.store.Probe(context.Background()); err == nil {
		t.Fatal("Probe of a failing primary succeeded")
	}
	if got := <-f.states; got != fallback.Degraded || f.store.State() != fallback.Degraded {
		t.Fatalf("after a failed Probe: switched to %v, State %v", got, f.store.State())
	}
	f.primary.mode.Store(int32(healthy))
	<-f.clock.slept
	f.clock.tick(t) // the probe loop's good probe closes the breaker
	if got := <-f.states; got != fallback.Primary {
		t.Fatalf("after a good probe: switched to %v", got)
	}
}

// With a HealthInterval the probe loop watches the primary while it is in
// use, so that the breaker opens without traffic, and keeps running after
// it closes again.
func TestHealthInterval(t *testing.T) {
	f := newFixture(t, fallback.Options{HealthInterval: time.Second})
	<-f.clock.slept // the loop waits for its first health check
	f.clock.tick(t) // a good one: nothing changes
	<-f.clock.slept
	if f.store.State() != fallback.Primary {
		t.Fatalf("after a good health check: %v", f.store.State())
	}
	f.primary.mode.Store(int32(failing))
	f.clock.tick(t) // a failed one, with no traffic at all
	if got := <-f.states; got != fallback.Degraded {
		t.Fatalf("after a failed health check: switched to %v", got)
	}
	<-f.clock.slept
	f.primary.mode.Store(int32(healthy))
	f.clock.tick(t) // a good probe closes the breaker
	if got := <-f.states; got != fallback.Primary {
		t.Fatalf("after a good probe: switched to %v", got)
	}
	<-f.clock.slept // and the loop goes on watching
	if s := f.store.Stats(); s.Switches != 2 {
		t.Errorf("Stats = %+v, want 2 switches", s)
	}
}

// TestNoDoubleAdmissionReplay replays the stall pattern of the fault test
// on a fixed clock, exactly: 8 requests a millisecond on one key of 100/s
// with a burst of 100, the primary failing for 80ms of every 400ms, for
// 4 seconds. One process (Instances 1) with its callers in turn admits
// no more than an exact limiter on the same arrivals, across 20 switches.
func TestNoDoubleAdmissionReplay(t *testing.T) {
	// A probe interval of 1µs: each tick moves the clock by no more.
	f := newFixture(t, fallback.Options{Threshold: 3, ProbeInterval: time.Microsecond})
	limit := floodgate.TokenBucket(100, time.Second, 100)
	lim := limiter(t, f.store, limit)
	exact := limiter(t, floodgate.NewMemoryStore(&floodgate.MemoryOptions{Clock: f.clock, SweepInterval: -1}), limit)
	ctx := context.Background()
	admitted, want, local := 0, 0, 0
	for ms := range 4000 {
		now := storetest.Base.Add(time.Duration(ms) * time.Millisecond)
		f.clock.Set(now)
		switch ms % 400 {
		case 320:
			f.primary.mode.Store(int32(failing))
		case 0:
			if f.primary.mode.Load() == int32(failing) {
				f.primary.mode.Store(int32(healthy))
				f.clock.tick(t) // the probe succeeds, settles, and closes the breaker
				for s := range f.states {
					if s == fallback.Primary {
						break
					}
				}
			}
		}
		for range 8 {
			r, err := lim.Allow(ctx, "hot")
			if err != nil {
				t.Fatal(err)
			}
			if r.Allowed {
				admitted++
				if r.Source == floodgate.SourceLocal {
					local++
				}
			}
			if r, _ := exact.Allow(ctx, "hot"); r.Allowed {
				want++
			}
		}
	}
	st := f.store.Stats()
	t.Logf("admitted %d (%d locally), an exact limiter %d; %d switches, %d units settled", admitted, local, want, st.Switches, st.Settled)
	if st.Switches != 19 || local == 0 {
		t.Fatalf("%d switches and %d local admissions, want 19 and some", st.Switches, local)
	}
	if admitted > want {
		t.Errorf("admitted %d, more than an exact limiter's %d", admitted, want)
	}
}

// parted is a primary whose keys live in two partitions, "odd" and
// "even", by their last byte, of which the test fails one; it records the
// keys it is asked.
type parted struct {
	floodgate.Store
	down atomic.Value // the failing partition, "" for none
	mu   sync.Mutex
	seen []string
}

// newParted returns a parted memory store on clock, with no partition
// down, closed when the test ends.
func newParted(t *testing.T, clock floodgate.Clock) *parted {
	p := &parted{Store: floodgate.NewMemoryStore(&floodgate.MemoryOptions{Clock: clock, SweepInterval: -1})}
	p.down.Store("")
	t.Cleanup(func() { p.Store.Close() })
	return p
}

func (p *parted) Partitioned() bool { return true }
func (p *parted) Partition(key string) string {
	if key[len(key)-1]%2 == 1 {
		return "odd"
	}
	return "even"
}

func (p *parted) Prepare(limits []core.Spec) (core.Policy, error) {
	pol, err := p.Store.Prepare(limits)
	return &partedPolicy{p, pol}, err
}

type partedPolicy struct {
	p *parted
	core.Policy
}

// asked records a call on key, and fails it when key's partition is down.
func (p *parted) asked(key string) error {
	p.mu.Lock()
	p.seen = append(p.seen, key)
	p.mu.Unlock()
	if down, _ := p.down.Load().(string); down != "" && p.Partition(key) == down {
		return floodgate.ErrStore
	}
	return nil
}

func (pp *partedPolicy) Take(ctx context.Context, key string, n int64) (core.Decision, error) {
	if err := pp.p.asked(key); err != nil {
		return core.Decision{}, err
	}
	return pp.Policy.Take(ctx, key, n)
}

// TestPartitionBreakers: with a partitioned primary, one partition's
// failure opens only its breaker, its probes use a key in that partition,
// and the other partition's keys keep going to the primary.
func TestPartitionBreakers(t *testing.T) {
	clock := newGateClock()
	primary := newParted(t, clock)
	// "probe0" is in the even partition: the odd one picks its own probe key.
	fb := fallback.New(primary, &fallback.Options{Clock: clock, Threshold: 2, ProbeKey: "probe0", Logger: slog.New(slog.DiscardHandler)})
	t.Cleanup(func() { fb.Close() })
	lim := limiter(t, fb, floodgate.PerSecond(1000))
	ctx := context.Background()
	source := func(key string) floodgate.Source {
		t.Helper()
		r, err := lim.Allow(ctx, key)
		if err != nil {
			t.Fatal(err)
		}
		return r.Source
	}
	primary.down.Store("odd")
	for range 3 {
		source("a1")
	}
	if s := source("a1"); s != floodgate.SourceLocal {
		t.Fatalf("a key of the failed partition: %v", s)
	}
	if s := source("b2"); s != floodgate.SourceStore {
		t.Fatalf("a key of the healthy partition: %v", s)
	}
	primary.mu.Lock()
	primary.seen = nil
	primary.mu.Unlock()
	<-clock.slept // a's probe loop waits for its tick
	clock.tick(t) // a failing probe
	<-clock.slept
	primary.mu.Lock()
	probes := slices.Clone(primary.seen)
	primary.mu.Unlock()
	if len(probes) != 1 || primary.Partition(probes[0]) != "odd" || !strings.HasPrefix(probes[0], "probe") {
		t.Fatalf("probe keys %q, want one probe in the failed partition", probes)
	}
	primary.down.Store("")
	clock.tick(t) // a good probe closes a's breaker
	deadline := time.Now().Add(5 * time.Second)
	for fb.State() != fallback.Primary && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	if s := source("a1"); s != floodgate.SourceStore || fb.Stats().Switches != 2 {
		t.Fatalf("after a's recovery: %v, %d switches", s, fb.Stats().Switches)
	}
}

func (p *flakyPolicy) SetOverride(ctx context.Context, key string, o *core.Override, st core.Strategy) error {
	if err := p.fail(ctx); err != nil {
		return err
	}
	return p.Policy.SetOverride(ctx, key, o, st)
}

func (p *flakyPolicy) GetOverride(ctx context.Context, key string) (core.Override, bool, error) {
	if err := p.fail(ctx); err != nil {
		return core.Override{}, false, err
	}
	return p.Policy.GetOverride(ctx, key)
}

func (p *flakyPolicy) ListOverrides(ctx context.Context, fn func(string, core.Override) bool) error {
	if err := p.fail(ctx); err != nil {
		return err
	}
	return p.Policy.ListOverrides(ctx, fn)
}
