package fallback_test

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/floodgate/floodgate"
	"github.com/floodgate/floodgate/core"
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
)

// flaky is a floodgate.Store over the memory store whose failures the test
// switches on and off. It is a stand-in for a primary store in the unit
// tests; the fault tests use a real redis-server.
type flaky struct {
	floodgate.Store
	mode  atomic.Int32
	calls atomic.Int64
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

func (p *flakyPolicy) Take(ctx context.Context, key string, n int64) (core.Decision, error) {
	p.f.calls.Add(1)
	switch mode(p.f.mode.Load()) {
	case failing:
		return core.Decision{}, floodgate.ErrStore
	case hanging:
		<-ctx.Done()
		return core.Decision{}, ctx.Err()
	}
	return p.Policy.Take(ctx, key, n)
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

type lockedWriter struct {
	mu sync.Mutex
	w  *bytes.Buffer
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

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
		policy    fallback.Policy
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
			f := newFixture(t, fallback.Options{Policy: tt.policy, Instances: tt.instances, Threshold: 1000})
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

func TestParsePolicy(t *testing.T) {
	for _, p := range []fallback.Policy{fallback.Local, fallback.FailOpen, fallback.FailClosed} {
		got, err := fallback.ParsePolicy(p.String())
		if err != nil || got != p {
			t.Errorf("ParsePolicy(%q) = %v, %v", p.String(), got, err)
		}
	}
	if _, err := fallback.ParsePolicy("open"); err == nil {
		t.Error("ParsePolicy(open) succeeded")
	}
}

// A hung primary costs each caller the budget, no more, and the decision
// comes from the fallback.
func TestBudget(t *testing.T) {
	f := newFixture(t, fallback.Options{Budget: 5 * time.Millisecond, Threshold: 1000})
	f.primary.mode.Store(int32(hanging))
	r, err := limiter(t, f.store, floodgate.PerSecond(5)).AllowN(context.Background(), "k", 1)
	if err != nil || !r.Allowed || r.Source != floodgate.SourceLocal {
		t.Fatalf("Take on a hung primary = %+v, %v; want allowed by the local limiter", r, err)
	}
	if got := f.store.Stats().Failures; got != 1 {
		t.Errorf("Failures = %d, want 1", got)
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
