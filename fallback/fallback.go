// Package fallback keeps rate limiting working when a shared store (Redis)
// fails. A fallback Store wraps a primary store; while the primary answers
// within a time budget, every decision is the primary's. When a call fails
// or is too slow, that decision is answered by the failure policy: a local
// in-memory limiter with a share of each limit (the default), allow
// everything (fail open) or deny everything (fail closed). After a few
// failures in a row a breaker opens: decisions stop going to the primary,
// and one background loop per Store probes it until it answers, then
// switches back.
//
// Every Result says who decided it in its Source field; switches are
// logged, counted and reported to an optional hook.
//
//	rs, _ := redisstore.NewFromURL("redis://127.0.0.1:6379/0", nil)
//	store := fallback.New(rs, &fallback.Options{Instances: 4})
//	defer store.Close()
//	limiter, _ := floodgate.NewLimiter(store, []floodgate.Limit{floodgate.PerMinute(100)}, nil)
package fallback

import (
	"context"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/floodgate/floodgate"
	"github.com/floodgate/floodgate/core"
)

// Policy is what a Store answers while its primary store is failing.
type Policy uint8

// The policies; the README compares them.
const (
	// Local answers from a local in-memory limiter that applies each
	// limit's share (core.Spec.Share) of Instances. Limiting goes on, per process, at about
	// the global rate when Instances is right. It is the default.
	Local Policy = iota
	// FailOpen allows every request. Nothing is limited during an outage:
	// pick it when a false denial costs more than abuse.
	FailOpen
	// FailClosed denies every request, with RetryAfter set to the probe
	// interval. Nothing gets through during an outage: pick it when the
	// limit protects something that must never be exceeded.
	FailClosed
)

// String returns "local", "fail-open" or "fail-closed".
func (p Policy) String() string {
	switch p {
	case Local:
		return "local"
	case FailOpen:
		return "fail-open"
	case FailClosed:
		return "fail-closed"
	}
	return "Policy(" + strconv.Itoa(int(p)) + ")"
}

// ParsePolicy returns the Policy whose String is s.
func ParsePolicy(s string) (Policy, error) {
	for _, p := range []Policy{Local, FailOpen, FailClosed} {
		if p.String() == s {
			return p, nil
		}
	}
	return 0, fmt.Errorf("fallback: unknown policy %q (want local, fail-open or fail-closed)", s)
}

// State is the state of a Store's breaker.
type State uint8

// The states.
const (
	// Primary: decisions go to the primary store.
	Primary State = iota
	// Degraded: the breaker is open; decisions follow the policy without
	// calling the primary, and a background loop probes it.
	Degraded
)

// String returns "primary" or "degraded".
func (s State) String() string {
	if s == Degraded {
		return "degraded"
	}
	return "primary"
}

// Options configures a Store. The zero value (or nil) gives the defaults.
type Options struct {
	// Policy is what to answer while the primary fails. Default: Local.
	Policy Policy
	// Instances is how many processes share the limits. The local limiter
	// applies each limit's 1/Instances share (see core.Spec.Share), so that Instances
	// processes cut off from the primary together admit about the global
	// limit rather than Instances times it. Default: 1.
	Instances int64
	// Budget is the longest a decision waits for the primary; a slower
	// call counts as a failure and that decision follows the policy, so a
	// hung primary costs a caller at most Budget. The primary must honour
	// context deadlines: build go-redis clients with ContextTimeoutEnabled
	// (redisstore.NewFromURL does). Default: 50ms; negative: no budget.
	Budget time.Duration
	// Threshold is how many failed calls in a row open the breaker.
	// Default: 3.
	Threshold int
	// ProbeInterval is how often the open breaker probes the primary, and
	// the RetryAfter of a FailClosed denial. Default: 100ms.
	ProbeInterval time.Duration
	// HealthInterval, when positive, keeps the probe loop running while
	// the primary is in use too: it probes the primary every
	// HealthInterval, and one failed probe opens the breaker at once. Then
	// State (and a service's readiness) follows the primary's health even
	// with no traffic. Default: 0, probe only while the breaker is open.
	HealthInterval time.Duration
	// ProbeKey is the key that probes write to, with a limit so high that
	// they are never denied. Default: "floodgate-probe".
	ProbeKey string
	// Local is the store the Local policy answers from. Default: a new
	// in-memory store (on Clock), which Close closes.
	Local floodgate.Store
	// Clock times the probe loop, and is given to the default local store.
	// Default: floodgate.SystemClock().
	Clock floodgate.Clock
	// Logger receives one line per switch: a warning when the breaker
	// opens, an info line when the primary is back. Default: slog.Default().
	Logger *slog.Logger
	// OnSwitch, when set, is called on every switch with the new state,
	// from the goroutine that switched. It must not block.
	OnSwitch func(State)
}

// Stats are a Store's counters since New.
type Stats struct {
	Failures  uint64 // primary calls that failed or exceeded the budget
	Fallbacks uint64 // decisions answered by the policy rather than the primary
	Switches  uint64 // breaker state changes, both ways
	Probes    uint64 // probe calls made while degraded
}

// Store is a floodgate.Store that calls a primary store and follows a
// failure policy when it fails. It is safe for concurrent use.
type Store struct {
	primary   floodgate.Store
	local     floodgate.Store
	ownLocal  bool
	policy    Policy
	instances int64
	budget    time.Duration
	threshold int64
	interval  time.Duration
	health    time.Duration // 0: the probe loop runs only while degraded
	probeKey  string
	probe     core.Policy // the primary's policy for probes
	clock     floodgate.Clock
	log       *slog.Logger
	onSwitch  func(State)

	degraded atomic.Bool
	fails    atomic.Int64 // consecutive failures while Primary
	stats    struct{ failures, fallbacks, switches, probes atomic.Uint64 }

	mu      sync.Mutex // orders Close with since and the start of probe loops
	closed  atomic.Bool
	since   time.Time // when the breaker last opened
	stop    context.CancelFunc
	stopCtx context.Context
	wg      sync.WaitGroup
}

var _ floodgate.Store = (*Store)(nil)

// probeSpec never denies a probe: it exists so that a probe runs the same
// script, and writes, as a decision does.
func probeSpec() core.Spec {
	s, err := core.NewBucket("probe", core.MaxQuota, time.Second, core.MaxQuota, "burst")
	if err != nil {
		panic(err) // constant, valid parameters
	}
	return s
}

// New returns a Store over primary. Closing the Store stops its probe loop
// and closes the local store if New made it; it does not close primary.
func New(primary floodgate.Store, opts *Options) *Store {
	var o Options
	if opts != nil {
		o = *opts
	}
	if o.Instances < 1 {
		o.Instances = 1
	}
	if o.Budget == 0 {
		o.Budget = 50 * time.Millisecond
	}
	if o.Threshold < 1 {
		o.Threshold = 3
	}
	if o.ProbeInterval <= 0 {
		o.ProbeInterval = 100 * time.Millisecond
	}
	if o.ProbeKey == "" {
		o.ProbeKey = "floodgate-probe"
	}
	if o.Clock == nil {
		o.Clock = floodgate.SystemClock()
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	s := &Store{
		primary: primary, local: o.Local, policy: o.Policy, instances: o.Instances,
		budget: o.Budget, threshold: int64(o.Threshold), interval: o.ProbeInterval, health: max(o.HealthInterval, 0),
		probeKey: o.ProbeKey, clock: o.Clock, log: o.Logger, onSwitch: o.OnSwitch,
	}
	if s.local == nil && s.policy == Local {
		s.local = floodgate.NewMemoryStore(&floodgate.MemoryOptions{Clock: o.Clock})
		s.ownLocal = true
	}
	var err error
	if s.probe, err = primary.Prepare([]core.Spec{probeSpec()}); err != nil {
		// A primary that cannot prepare a valid limit is closed: its
		// decisions fail the same way, and the probe never switches back.
		s.probe = failing{err}
	}
	s.stopCtx, s.stop = context.WithCancel(context.Background())
	if s.health > 0 {
		s.wg.Add(1)
		go s.probeLoop()
	}
	return s
}

// Probe checks the primary now, with one probe decision within the
// budget: when it fails, the breaker opens at once (and the error is
// returned); when it succeeds while the breaker is open, the probe loop
// closes it within a probe interval. floodgate serve calls it at start,
// so that its readiness reflects Redis from the first moment.
func (s *Store) Probe(ctx context.Context) error {
	if s.closed.Load() {
		return floodgate.ErrClosed
	}
	err := s.probeOnce(ctx)
	if err != nil {
		s.stats.failures.Add(1)
		s.open(err)
	}
	return err
}

// State reports whether decisions currently go to the primary.
func (s *Store) State() State {
	if s.degraded.Load() {
		return Degraded
	}
	return Primary
}

// Stats returns the Store's counters.
func (s *Store) Stats() Stats {
	return Stats{
		Failures:  s.stats.failures.Load(),
		Fallbacks: s.stats.fallbacks.Load(),
		Switches:  s.stats.switches.Load(),
		Probes:    s.stats.probes.Load(),
	}
}

// Prepare implements floodgate.Store: it prepares limits on the primary
// and, for the Local policy, their local shares on the local store.
func (s *Store) Prepare(limits []core.Spec) (core.Policy, error) {
	if err := core.CheckSpecs(limits); err != nil {
		return nil, err
	}
	if s.closed.Load() {
		return nil, floodgate.ErrClosed
	}
	primary, err := s.primary.Prepare(limits)
	if err != nil {
		return nil, err
	}
	p := &policy{s: s, primary: primary, quota: limits[0].Quota}
	if s.policy == Local {
		shares := make([]core.Spec, len(limits))
		for i := range limits {
			if shares[i], err = limits[i].Share(s.instances); err != nil {
				return nil, err
			}
		}
		if p.local, err = s.local.Prepare(shares); err != nil {
			return nil, err
		}
	}
	return p, nil
}

// policy is the Store's core.Policy: the primary's policy, and the
// local store's policy of the limits' shares.
type policy struct {
	s       *Store
	primary core.Policy
	local   core.Policy // nil unless the policy is Local
	quota   int64       // the first limit's, for fail-open and fail-closed answers
}

// Take implements core.Policy. It returns the primary's decision when
// the primary answers within the budget, and otherwise the policy's, with
// Source telling which. Its errors are input errors, floodgate.ErrClosed,
// the caller's own context error when ctx ends first (never counted as a
// failure of the primary), and the local store's errors.
func (p *policy) Take(ctx context.Context, key string, n int64) (core.Decision, error) {
	if err := core.CheckRequest(key, n); err != nil {
		return core.Decision{}, err
	}
	s := p.s
	if s.closed.Load() {
		return core.Decision{}, floodgate.ErrClosed
	}
	if !s.degraded.Load() {
		d, err := callPrimary(s, ctx, func(ctx context.Context) (core.Decision, error) {
			return p.primary.Take(ctx, key, n)
		})
		if err == nil {
			return d, nil
		}
		if ctxErr := ctx.Err(); ctxErr != nil {
			return core.Decision{}, ctxErr
		}
		if core.IsInvalidInput(err) {
			return core.Decision{}, err
		}
		s.failed(err)
	}
	return p.answer(ctx, key, n)
}

// answer decides by the policy.
func (p *policy) answer(ctx context.Context, key string, n int64) (core.Decision, error) {
	s := p.s
	s.stats.fallbacks.Add(1)
	switch s.policy {
	case FailOpen:
		return core.Decision{Verdict: core.Verdict{Allowed: true, Remaining: p.quota}, Source: core.SourceFailOpen}, nil
	case FailClosed:
		us := s.interval.Microseconds()
		return core.Decision{Verdict: core.Verdict{Retry: us, Reset: us}, Source: core.SourceFailClosed}, nil
	}
	d, err := p.local.Take(ctx, key, n)
	d.Source = core.SourceLocal
	return d, err
}

// Reset implements core.Policy: it resets key in the local store and
// in the primary, and returns the primary's error, if any.
func (p *policy) Reset(ctx context.Context, key string) error {
	if err := core.CheckKey(key); err != nil {
		return err
	}
	s := p.s
	if s.closed.Load() {
		return floodgate.ErrClosed
	}
	if p.local != nil {
		if err := p.local.Reset(ctx, key); err != nil {
			return err
		}
	}
	_, err := callPrimary(s, ctx, func(ctx context.Context) (core.Decision, error) {
		return core.Decision{}, p.primary.Reset(ctx, key)
	})
	return err
}

// callPrimary calls f with the budget, and counts a success.
func callPrimary(s *Store, ctx context.Context, f func(context.Context) (core.Decision, error)) (core.Decision, error) {
	cctx, cancel := ctx, context.CancelFunc(nil)
	if s.budget > 0 {
		cctx, cancel = context.WithTimeout(ctx, s.budget)
	}
	d, err := f(cctx)
	if cancel != nil {
		cancel()
	}
	if err == nil && s.fails.Load() != 0 {
		s.fails.Store(0)
	}
	return d, err
}

// failed counts a failure of the primary and opens the breaker at the
// threshold.
func (s *Store) failed(err error) {
	s.stats.failures.Add(1)
	if s.fails.Add(1) < s.threshold {
		return
	}
	s.open(err)
}

// open opens the breaker, unless it is open already, and starts the probe
// loop unless it always runs.
func (s *Store) open(err error) {
	if !s.degraded.CompareAndSwap(false, true) {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed.Load() {
		return
	}
	s.since = s.clock.Now()
	s.stats.switches.Add(1)
	s.log.Warn("floodgate: primary store failing; answering by policy until it recovers",
		"policy", s.policy.String(), "error", err.Error())
	if s.onSwitch != nil {
		s.onSwitch(Degraded)
	}
	if s.health == 0 {
		s.wg.Add(1)
		go s.probeLoop()
	}
}

// probeOnce makes one probe decision on the primary, within the budget.
func (s *Store) probeOnce(ctx context.Context) error {
	s.stats.probes.Add(1)
	_, err := callPrimary(s, ctx, func(ctx context.Context) (core.Decision, error) {
		return s.probe.Take(ctx, s.probeKey, 1)
	})
	return err
}

// probeLoop is the Store's one probe loop: while the breaker is open it
// calls the primary every probe interval and closes the breaker when the
// primary answers within the budget. With a HealthInterval it always runs,
// and while the primary is in use probes it every HealthInterval, opening
// the breaker on a failure; otherwise it ends when the breaker closes.
// Close stops it.
func (s *Store) probeLoop() {
	defer s.wg.Done()
	for {
		degraded := s.degraded.Load()
		interval := s.interval
		if !degraded {
			interval = s.health
		}
		if s.clock.Sleep(s.stopCtx, interval) != nil {
			return
		}
		err := s.probeOnce(s.stopCtx)
		if s.stopCtx.Err() != nil {
			return
		}
		if !degraded {
			if err != nil {
				s.stats.failures.Add(1)
				s.open(err)
			}
			continue
		}
		if err != nil {
			s.stats.failures.Add(1)
			continue
		}
		s.mu.Lock()
		down := s.clock.Now().Sub(s.since)
		s.fails.Store(0)
		s.degraded.Store(false)
		s.stats.switches.Add(1)
		s.log.Info("floodgate: primary store recovered; decisions go to it again",
			"policy", s.policy.String(), "degraded_for", down.String())
		if s.onSwitch != nil {
			s.onSwitch(Primary)
		}
		s.mu.Unlock()
		if s.health == 0 {
			return
		}
	}
}

// Close stops the probe loop, waits for it, and closes the local store if
// New made it. It does not close the primary. It is safe to call more than
// once.
func (s *Store) Close() error {
	s.mu.Lock()
	if s.closed.Swap(true) {
		s.mu.Unlock()
		return nil
	}
	s.stop()
	s.mu.Unlock()
	s.wg.Wait()
	if s.ownLocal {
		return s.local.Close()
	}
	return nil
}

// failing is a Policy whose calls all fail with err.
type failing struct{ err error }

func (f failing) Take(context.Context, string, int64) (core.Decision, error) {
	return core.Decision{}, f.err
}
func (f failing) Reset(context.Context, string) error { return f.err }
