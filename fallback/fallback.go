// Package fallback keeps rate limiting working when a shared store (Redis)
// fails. A fallback Store wraps a primary store; while the primary answers
// within a time budget, every decision is the primary's. When a call fails
// or is too slow, that decision is answered by the failure mode: a local
// in-memory limiter with a share of each limit (the default), allow
// everything (fail open) or deny everything (fail closed). After a few
// failures in a row a breaker opens: decisions stop going to the primary,
// and one background loop per Store probes it until it answers, then
// switches back.
//
// Every Result says who decided it in its Source field; switches are
// logged, counted and reported to an optional hook.
//
// Redis and the local limiter never hand out the same capacity twice.
// While Redis decides, each decision also brings the key's local share
// down to its share of what Redis says is left, so a switch to local
// answers starts from Redis's state, not from a full bucket. While the
// local limiter answers, the keys it admits on are kept in a ledger, and
// when the primary answers probes again, each of them is brought down on
// the primary to what the local limiter has left (core.Policy.Charge) before
// decisions go back to it: what was admitted locally is not handed out a
// second time, even by a Redis that restarted empty. docs/fallback.md
// states the bound that remains and how it is measured.
//
//	rs, _ := redisstore.NewFromURL("redis://127.0.0.1:6379/0", nil)
//	store := fallback.New(rs, &fallback.Options{Instances: 4})
//	defer store.Close()
//	limiter, _ := floodgate.NewLimiter(store, []floodgate.Limit{floodgate.PerMinute(100)}, nil)
package fallback

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/floodgate/floodgate"
	"github.com/floodgate/floodgate/core"
	"github.com/floodgate/floodgate/internal/lib/lograte"
	"github.com/floodgate/floodgate/internal/lib/slicepool"
)

// Mode is what a Store answers while its primary store is failing.
type Mode uint8

// The modes; docs/fallback.md compares them.
const (
	// Local answers from a local in-memory limiter that applies each
	// limit's share (core.Spec.Share) of Instances. Limiting goes on, per process, at about
	// the global rate when Instances is right. It is the default.
	Local Mode = iota
	// FailOpen allows every request. Nothing is limited during an outage:
	// pick it when a false denial costs more than abuse.
	FailOpen
	// FailClosed denies every request, with RetryAfter set to the probe
	// interval. Nothing gets through during an outage: pick it when the
	// limit protects something that must never be exceeded.
	FailClosed
)

// String returns "local", "fail-open" or "fail-closed".
func (p Mode) String() string {
	switch p {
	case Local:
		return "local"
	case FailOpen:
		return "fail-open"
	case FailClosed:
		return "fail-closed"
	}
	return "Mode(" + strconv.Itoa(int(p)) + ")"
}

// ParseMode returns the Mode whose String is s.
func ParseMode(s string) (Mode, error) {
	for _, p := range []Mode{Local, FailOpen, FailClosed} {
		if p.String() == s {
			return p, nil
		}
	}
	return 0, fmt.Errorf("fallback: unknown mode %q (want local, fail-open or fail-closed)", s)
}

// State is the state of a Store's breaker.
type State uint8

// The states.
const (
	// Primary: decisions go to the primary store.
	Primary State = iota
	// Degraded: the breaker is open; decisions follow the mode without
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
	// Mode is what to answer while the primary fails. Default: Local.
	Mode Mode
	// Instances is how many processes share the limits. The local limiter
	// applies each limit's 1/Instances share (see core.Spec.Share), so that Instances
	// processes cut off from the primary together admit about the global
	// limit rather than Instances times it. Default: 1.
	Instances int64
	// Budget is the longest a decision waits for the primary; a slower
	// call counts as a failure and that decision follows the mode, so a
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
	// Local is the store the Local mode answers from. Default: a new
	// in-memory store (on Clock), which Close closes.
	Local floodgate.Store
	// Clock times the probe loop, and is given to the default local store.
	// Default: floodgate.SystemClock().
	Clock floodgate.Clock
	// Logger receives one line per switch: a warning when the breaker
	// opens, naming the primary's error (or, when the call only ran out
	// of budget, the primary's Cause, see Causer), and an info line when
	// the primary is back; and, at most once a second, a warning about
	// keys that fail alone (floodgate.ErrKey) in probes and settles.
	// Default: slog.Default().
	Logger *slog.Logger
	// OnSwitch, when set, is called on every switch with the new state,
	// from the goroutine that switched. It must not block.
	OnSwitch func(State)
}

// Stats are a Store's counters since New.
type Stats struct {
	Failures  uint64 // primary calls that failed or exceeded the budget
	Fallbacks uint64 // decisions answered by the mode rather than the primary
	Switches  uint64 // breaker state changes, both ways
	Probes    uint64 // probe calls made while degraded
	// Settled counts the units charged to the primary when it came back,
	// for what the local limiter admitted; Unsettled, the local
	// admissions on keys that could not be settled (more than
	// MaxLedgerKeys keys in one outage, or a primary that cannot charge).
	Settled, Unsettled uint64
	// KeyErrors counts the primary's errors about one key
	// (floodgate.ErrKey: foreign data at its Redis keys, an ACL's
	// refusal), which never count as failures: the decision's caller gets
	// the error, and a key of the ledger that fails so is dropped from it
	// unsettled, so that it cannot hold the breaker open.
	KeyErrors uint64
}

// MaxLedgerKeys is how many keys with local admissions a Store keeps for
// settling with the primary when it is back. Admissions on more keys than
// that during one outage are counted in Stats.Unsettled.
const MaxLedgerKeys = 100_000

// settleWorkers is how many charges a Store sends to the primary at once
// when it settles its ledger.
const settleWorkers = 16

// Store is a floodgate.Store that calls a primary store and follows a
// failure mode when it fails. It is safe for concurrent use.
type Store struct {
	// TakeGroup's per-request policies and requests to the primary (or
	// the local store), reused: neither store keeps the requests it is
	// given once its TakeGroup returns.
	groupPols slicepool.Pool[*policy]
	groupReqs slicepool.Pool[core.Request]
	primary   floodgate.Store
	local     floodgate.Store
	ownLocal  bool
	mode      Mode
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

	main     *breaker         // the breaker of the probe key's partition
	parts    core.Partitioner // the primary's, nil if it has one partition
	breakers sync.Map         // partition name -> *breaker, with parts
	mirrored sync.Map         // key -> []core.Spec: the overrides mirrored in the local store
	stats    struct {
		failures, fallbacks, switches, probes atomic.Uint64
		settled, unsettled, keyErrors         atomic.Uint64
	}
	keyLog *lograte.Limiter // of the log lines about ErrKey

	// The ledger: the keys the local limiter admitted on, for settling
	// with the primary when it is back.
	ledgMu  sync.Mutex
	pending map[ledgerKey]struct{}

	mu      sync.Mutex // orders Close with the breakers and the start of probe loops
	closed  atomic.Bool
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
		primary: primary, local: o.Local, mode: o.Mode, instances: o.Instances,
		budget: o.Budget, threshold: int64(o.Threshold), interval: o.ProbeInterval, health: max(o.HealthInterval, 0),
		probeKey: o.ProbeKey, clock: o.Clock, log: o.Logger, onSwitch: o.OnSwitch,
		keyLog: lograte.New(time.Second, func() time.Time { return o.Clock.Now() }),
	}
	if s.local == nil && s.mode == Local {
		s.local = floodgate.NewMemoryStore(&floodgate.MemoryOptions{Clock: o.Clock})
		s.ownLocal = true
	}
	if s.mode == Local {
		s.pending = make(map[ledgerKey]struct{})
	}
	var err error
	if s.probe, err = primary.Prepare([]core.Spec{probeSpec()}); err != nil {
		// A primary that cannot prepare a valid limit is closed: its
		// decisions fail the same way, and the probe never switches back.
		s.probe = failing{err: err}
	}
	s.stopCtx, s.stop = context.WithCancel(context.Background())
	if pt, ok := primary.(core.Partitioner); ok && pt.Partitioned() {
		s.parts = pt
	}
	s.main = &breaker{s: s, probeKey: s.probeKey}
	if s.parts != nil {
		s.main.name = s.parts.Partition(s.probeKey)
		s.breakers.Store(s.main.name, s.main)
	}
	if s.health > 0 {
		s.wg.Add(1)
		go s.main.probeLoop()
	}
	return s
}

// breaker is the circuit breaker of one partition of the primary's keys:
// of all of them, or, with a core.Partitioner (Redis Cluster), of those
// on one master, so that one dead master does not send the keys of the
// others to the local limiter.
type breaker struct {
	s        *Store
	name     string // the partition, "" for all keys
	probeKey string // a key in the partition
	degraded atomic.Bool
	fails    atomic.Int64 // consecutive failures while Primary
	since    time.Time    // when it last opened; guarded by s.mu
}

// breaker returns the breaker of key's partition.
func (s *Store) breaker(key string) *breaker {
	if s.parts == nil {
		return s.main
	}
	name := s.parts.Partition(key)
	if b, ok := s.breakers.Load(name); ok {
		return b.(*breaker)
	}
	b, _ := s.breakers.LoadOrStore(name, &breaker{s: s, name: name, probeKey: s.probeKeyIn(name)})
	return b.(*breaker)
}

// probeKeyIn returns a key in the partition name: the probe key with a
// number, the first that lands there (a few tries for a Cluster's slots).
func (s *Store) probeKeyIn(name string) string {
	for i := range 100_000 {
		k := s.probeKey + "-" + strconv.Itoa(i)
		if s.parts.Partition(k) == name {
			return k
		}
	}
	return s.probeKey
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
	err := s.main.probeOnce(ctx)
	if err != nil {
		s.stats.failures.Add(1)
		s.main.open(err)
	}
	return err
}

// State reports whether decisions currently go to the primary: Degraded
// when any partition's breaker is open (with a Redis Cluster, any
// master's).
func (s *Store) State() State {
	if s.main.degraded.Load() {
		return Degraded
	}
	state := Primary
	s.breakers.Range(func(_, b any) bool {
		if b.(*breaker).degraded.Load() {
			state = Degraded
		}
		return state == Primary
	})
	return state
}

// Stats returns the Store's counters.
func (s *Store) Stats() Stats {
	return Stats{
		Failures:  s.stats.failures.Load(),
		Fallbacks: s.stats.fallbacks.Load(),
		Switches:  s.stats.switches.Load(),
		Probes:    s.stats.probes.Load(),
		Settled:   s.stats.settled.Load(),
		Unsettled: s.stats.unsettled.Load(),
		KeyErrors: s.stats.keyErrors.Load(),
	}
}

// Prepare implements floodgate.Store: it prepares limits on the primary
// and, for the Local mode, their local shares on the local store.
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
	if s.mode == Local {
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

// ledgerKey is a key with local admissions to settle, and its policy.
type ledgerKey struct {
	p   *policy
	key string
	b   *breaker // of the key's partition
}

// policy is the Store's core.Policy: the primary's policy, and the
// local store's policy of the limits' shares.
type policy struct {
	s       *Store
	primary core.Policy
	local   core.Policy // nil unless the mode is Local
	quota   int64       // the first limit's, for fail-open and fail-closed answers
}

// Take implements core.Policy. It returns the primary's decision when
// the primary answers within the budget, and otherwise the mode's, with
// Source telling which. Its errors are input errors, floodgate.ErrClosed,
// the caller's own context error when ctx ends first (never counted as a
// failure of the primary), the primary's errors about key alone
// (floodgate.ErrKey, never counted either: one poisoned key must not
// send every key to the mode), and the local store's errors.
func (p *policy) Take(ctx context.Context, key string, n int64) (core.Decision, error) {
	if err := core.CheckRequest(key, n); err != nil {
		return core.Decision{}, err
	}
	s := p.s
	if s.closed.Load() {
		return core.Decision{}, floodgate.ErrClosed
	}
	b := s.breaker(key)
	d, done, err := p.primaryFirst(ctx, b, func(ctx context.Context) (core.Decision, error) {
		return p.primary.Take(ctx, key, n)
	})
	if done {
		if err == nil {
			p.sync(key, n, &d)
		}
		return d, err
	}
	return p.answer(ctx, key, n, b)
}

// primaryFirst calls f on the primary unless b is open. It returns the
// primary's Decision and done when the primary answered; done and an
// error when the caller's context ended, the input is invalid, or the
// primary failed on this key alone (floodgate.ErrKey; none of them
// counts against the primary); and not done otherwise, when the mode
// answers (b has counted the failure).
func (p *policy) primaryFirst(ctx context.Context, b *breaker, f func(context.Context) (core.Decision, error)) (d core.Decision, done bool, err error) {
	if b.degraded.Load() {
		return core.Decision{}, false, nil
	}
	d, err = b.call(ctx, f)
	if err == nil {
		return d, true, nil
	}
	if ctxErr := ctx.Err(); ctxErr != nil {
		return core.Decision{}, true, ctxErr
	}
	if core.IsInvalidInput(err) {
		return core.Decision{}, true, err
	}
	if errors.Is(err, floodgate.ErrKey) {
		s := p.s
		s.stats.keyErrors.Add(1)
		return core.Decision{}, true, err
	}
	b.failed(err)
	return core.Decision{}, false, nil
}

// answer decides by the mode.
func (p *policy) answer(ctx context.Context, key string, n int64, b *breaker) (core.Decision, error) {
	s := p.s
	s.stats.fallbacks.Add(1)
	switch s.mode {
	case FailOpen:
		return core.Decision{Verdict: core.Verdict{Allowed: true, Remaining: p.quota}, Source: core.SourceFailOpen}, nil
	case FailClosed:
		us := s.interval.Microseconds()
		return core.Decision{Verdict: core.Verdict{Retry: us, Reset: us}, Source: core.SourceFailClosed}, nil
	}
	d, err := p.local.Take(ctx, key, n)
	d.Source = core.SourceLocal
	if err == nil && d.Allowed && n > 0 {
		p.record(key, n, b)
	}
	return d, err
}

// sync brings key's local share down to what the primary's Decision d
// says is left: it charges the local limiter what the primary admitted,
// and then whatever it holds beyond its share of the primary's remaining.
// Then a switch to local answers starts from the primary's state, not
// from a full bucket. It costs a memory-store decision or two per
// decision of the primary. It takes no context: the primary has charged
// by now, so a caller whose context ends as the answer comes back (an
// Envoy deadline, say) must not leave the local share unsynced, and the
// local store never waits.
func (p *policy) sync(key string, n int64, d *core.Decision) {
	ctx := context.Background()
	if p.local != nil {
		p.learn(ctx, key, d)
	}
	if p.local == nil || n == 0 {
		return
	}
	if !d.Allowed {
		n = 0
	}
	l, err := p.local.Charge(ctx, key, n)
	if err != nil {
		return
	}
	if target := d.Remaining / p.s.instances; l.Remaining > target {
		p.local.Charge(ctx, key, l.Remaining-target)
	}
}

// record notes in the ledger that key admitted n units locally, to be
// settled with the primary when it is back.
func (p *policy) record(key string, n int64, b *breaker) {
	s := p.s
	k := ledgerKey{p, key, b}
	s.ledgMu.Lock()
	if _, ok := s.pending[k]; !ok {
		if len(s.pending) >= MaxLedgerKeys {
			s.ledgMu.Unlock()
			s.stats.unsettled.Add(uint64(n))
			return
		}
		s.pending[k] = struct{}{}
	}
	s.ledgMu.Unlock()
}

// settle settles the keys of the ledger in b's partition with the
// primary (see policy.settle). It returns the first error; the keys it
// could not settle stay in the ledger.
func (b *breaker) settle(ctx context.Context) error {
	s := b.s
	s.ledgMu.Lock()
	keys := make([]ledgerKey, 0, len(s.pending))
	for k := range s.pending {
		if k.b == b {
			keys = append(keys, k)
		}
	}
	s.ledgMu.Unlock()
	if len(keys) == 0 {
		return nil
	}
	// The first error, kept once: errors of different types (a wrapped
	// ErrStore, a context's) cannot share an atomic.Value, which panics
	// on a second value of another type even where it would not store it.
	var (
		wg     sync.WaitGroup
		next   atomic.Int64
		failed atomic.Bool
		once   sync.Once
		first  error
	)
	for range min(settleWorkers, len(keys)) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1)) - 1
				if i >= len(keys) || failed.Load() {
					return
				}
				if err := keys[i].p.settle(ctx, keys[i]); err != nil {
					once.Do(func() { first = err; failed.Store(true) })
					return
				}
			}
		}()
	}
	wg.Wait()
	return first
}

// settle brings key down on the primary to what the local limiter has
// left, scaled from its share: it charges the primary the remaining it
// holds beyond Instances times the local remaining. That covers what was
// admitted locally (the local limiter started from the primary's state
// and counted it), and a primary that lost the key (a restart without
// persistence) as well. It takes the key out of the ledger first and puts
// it back if the primary fails, so that admissions recorded meanwhile are
// not lost.
func (p *policy) settle(ctx context.Context, k ledgerKey) error {
	s := p.s
	s.ledgMu.Lock()
	_, ok := s.pending[k]
	delete(s.pending, k)
	s.ledgMu.Unlock()
	if !ok {
		return nil
	}
	err := p.settleKey(ctx, k.key, k.b)
	if errors.Is(err, floodgate.ErrKey) {
		// The primary cannot settle this key until someone repairs it:
		// keeping it would fail every probe, and keep every key on the
		// mode, for one key.
		s.stats.keyErrors.Add(1)
		s.logKeyError("floodgate: dropped a key from the ledger unsettled: the primary fails on it alone", k.key, err)
		return nil
	}
	if err != nil {
		p.record(k.key, 0, k.b)
	}
	return err
}

// logKeyError logs an error about one key (floodgate.ErrKey), at most
// once a second, with how many were held back.
func (s *Store) logKeyError(msg, key string, err error) {
	if held, ok := s.keyLog.Allow(); ok {
		s.log.Warn(msg, "key", key, "error", err.Error(), "suppressed", held)
	}
}

func (p *policy) settleKey(ctx context.Context, key string, b *breaker) error {
	s := p.s
	l, err := p.local.Take(ctx, key, 0)
	if err != nil {
		return err
	}
	r, err := b.call(ctx, func(ctx context.Context) (core.Decision, error) {
		return p.primary.Take(ctx, key, 0)
	})
	if err != nil {
		return err
	}
	over := r.Remaining - l.Remaining*s.instances
	if over <= 0 {
		return nil
	}
	if _, err := b.call(ctx, func(ctx context.Context) (core.Decision, error) {
		return p.primary.Charge(ctx, key, over)
	}); err != nil {
		return err
	}
	s.stats.settled.Add(uint64(over))
	return nil
}

// Refund implements core.Policy.Refund: it gives n back on the primary, and on
// the local limiter too (at most its share's quota). While the primary
// fails, only the local limiter gets it back; the primary keeps the
// charge, which errs toward denying.
func (p *policy) Refund(ctx context.Context, key string, n int64) (core.Decision, error) {
	if err := core.CheckRequest(key, n); err != nil {
		return core.Decision{}, err
	}
	s := p.s
	if s.closed.Load() {
		return core.Decision{}, floodgate.ErrClosed
	}
	pr, lr := p.primary, p.local
	b := s.breaker(key)
	d, done, err := p.primaryFirst(ctx, b, func(ctx context.Context) (core.Decision, error) {
		return pr.Refund(ctx, key, n)
	})
	if done {
		if err == nil && lr != nil {
			lr.Refund(ctx, key, n)
		}
		return d, err
	}
	if lr == nil {
		d, err := p.answer(ctx, key, 0, b)
		d.Allowed = true
		return d, err
	}
	s.stats.fallbacks.Add(1)
	d, err = lr.Refund(ctx, key, n)
	d.Source = core.SourceLocal
	return d, err
}

// Charge implements core.Policy.Charge: it charges the primary, and when the
// primary fails, the local limiter (recording the charge in the ledger,
// like a local admission), or nothing under FailOpen and FailClosed.
func (p *policy) Charge(ctx context.Context, key string, n int64) (core.Decision, error) {
	if err := core.CheckRequest(key, n); err != nil {
		return core.Decision{}, err
	}
	s := p.s
	if s.closed.Load() {
		return core.Decision{}, floodgate.ErrClosed
	}
	b := s.breaker(key)
	d, done, err := p.primaryFirst(ctx, b, func(ctx context.Context) (core.Decision, error) {
		return p.primary.Charge(ctx, key, n)
	})
	if done {
		if err == nil {
			p.sync(key, n, &d)
		}
		return d, err
	}
	if p.local == nil {
		d, err := p.answer(ctx, key, 0, b)
		d.Allowed = true
		return d, err
	}
	s.stats.fallbacks.Add(1)
	d, err = p.local.Charge(ctx, key, n)
	d.Source = core.SourceLocal
	if err == nil && n > 0 {
		p.record(key, n, b)
	}
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
	_, err := s.breaker(key).call(ctx, func(ctx context.Context) (core.Decision, error) {
		return core.Decision{}, p.primary.Reset(ctx, key)
	})
	return err
}

// call calls f on the primary with the budget, and counts a success. A
// caller whose own deadline comes first (Envoy sends one with every rate
// limit call, 20ms by default) needs no timer of the budget's: its
// deadline ends the call first, with the same outcome.
func (b *breaker) call(ctx context.Context, f func(context.Context) (core.Decision, error)) (core.Decision, error) {
	cctx, cancel := ctx, context.CancelFunc(nil)
	if b.s.budget > 0 {
		if dl, ok := ctx.Deadline(); !ok || time.Until(dl) > b.s.budget {
			cctx, cancel = context.WithTimeout(ctx, b.s.budget)
		}
	}
	d, err := f(cctx)
	if cancel != nil {
		cancel()
	}
	if err == nil && b.fails.Load() != 0 {
		b.fails.Store(0)
	}
	return d, err
}

// failed counts a failure of the primary and opens the breaker at the
// threshold.
func (b *breaker) failed(err error) {
	b.s.stats.failures.Add(1)
	if b.fails.Add(1) < b.s.threshold {
		return
	}
	b.open(err)
}

// logAttrs are the attributes of b's log lines.
func (b *breaker) logAttrs(more ...any) []any {
	attrs := []any{"policy", b.s.mode.String()}
	if b.s.parts != nil {
		attrs = append(attrs, "server", b.name)
	}
	return append(attrs, more...)
}

// open opens the breaker, unless it is open already, and starts its probe
// loop unless it always runs.
func (b *breaker) open(err error) {
	if !b.degraded.CompareAndSwap(false, true) {
		return
	}
	s := b.s
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed.Load() {
		return
	}
	b.since = s.clock.Now()
	s.stats.switches.Add(1)
	attrs := b.logAttrs("error", err.Error())
	if cause := s.cause(err); cause != nil {
		attrs = b.logAttrs("error", cause.Error(), "call_error", err.Error())
	}
	s.log.Warn("floodgate: primary store failing; answering by policy until it recovers", attrs...)
	if s.onSwitch != nil {
		s.onSwitch(Degraded)
	}
	if s.health == 0 || b != s.main {
		s.wg.Add(1)
		go b.probeLoop()
	}
}

// Causer is a primary store that can say why its calls fail when all a
// call saw was its deadline: redisstore.Store keeps its connections' last
// error (a refused dial, a bad certificate, a WRONGPASS).
type Causer interface {
	// Cause returns the store's last underlying error since a success,
	// or nil.
	Cause() error
}

// Cause returns why the primary store's calls fail, as the primary tells
// (see Causer): its last underlying error since a success; nil when it
// cannot tell or when its last call succeeded.
func (s *Store) Cause() error {
	if c, ok := s.primary.(Causer); ok {
		return c.Cause()
	}
	return nil
}

// cause returns why err, a primary's failure that is only a context's
// error (the budget ran out), happened, as the primary tells: the error
// that the switch log names. It returns nil when err says more itself, or
// when the primary cannot tell.
func (s *Store) cause(err error) error {
	c, ok := s.primary.(Causer)
	if !ok || !(errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled)) {
		return nil
	}
	return c.Cause()
}

// probeOnce makes one probe decision on the primary, in b's partition,
// within the budget.
// An error about the probe key alone (floodgate.ErrKey: foreign data at
// it, an ACL that refuses it) is the primary answering: it is logged, and
// the probe succeeds.
func (b *breaker) probeOnce(ctx context.Context) error {
	b.s.stats.probes.Add(1)
	_, err := b.call(ctx, func(ctx context.Context) (core.Decision, error) {
		return b.s.probe.Take(ctx, b.probeKey, 1)
	})
	if errors.Is(err, floodgate.ErrKey) {
		b.s.stats.keyErrors.Add(1)
		b.s.logKeyError("floodgate: the probe key fails on its own; the primary answers", b.probeKey, err)
		return nil
	}
	return err
}

// probeLoop is the probe loop of a breaker: while it is open it calls the
// primary every probe interval, in the breaker's partition, and closes
// it when the primary answers within the budget, after settling the
// ledger. With a HealthInterval the main breaker's loop always runs, and
// while the primary is in use probes it every HealthInterval, opening the
// breaker on a failure; other loops end when their breaker closes. Close
// stops them.
func (b *breaker) probeLoop() {
	s := b.s
	defer s.wg.Done()
	always := s.health > 0 && b == s.main
	for {
		degraded := b.degraded.Load()
		interval := s.interval
		if !degraded {
			interval = s.health
		}
		if s.clock.Sleep(s.stopCtx, interval) != nil {
			return
		}
		err := b.probeOnce(s.stopCtx)
		if s.stopCtx.Err() != nil {
			return
		}
		if !degraded {
			if err != nil {
				s.stats.failures.Add(1)
				b.open(err)
			}
			continue
		}
		if err == nil && s.pending != nil {
			// Charge the primary for what was admitted locally before it
			// decides again, so that it does not hand out that capacity a
			// second time.
			err = b.settle(s.stopCtx)
		}
		if err != nil {
			s.stats.failures.Add(1)
			continue
		}
		s.mu.Lock()
		down := s.clock.Now().Sub(b.since)
		b.fails.Store(0)
		b.degraded.Store(false)
		s.stats.switches.Add(1)
		s.log.Info("floodgate: primary store recovered; decisions go to it again",
			b.logAttrs("degraded_for", down.String())...)
		if s.onSwitch != nil {
			s.onSwitch(Primary)
		}
		s.mu.Unlock()
		if s.pending != nil {
			// What was admitted locally while the ledger was settled.
			b.settle(s.stopCtx)
		}
		if !always {
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

// failing is a Policy whose calls all fail with err: the probe of a
// primary that cannot prepare a limit. Only Take is called on it.
type failing struct {
	core.Policy // nil: only Take is called
	err         error
}

func (f failing) Take(context.Context, string, int64) (core.Decision, error) {
	return core.Decision{}, f.err
}
func (f failing) Reset(context.Context, string) error { return f.err }
