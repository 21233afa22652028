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
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/floodgate/floodgate"
	"github.com/floodgate/floodgate/core"
	"github.com/floodgate/floodgate/internal/lib/lograte"
	"github.com/floodgate/floodgate/internal/lib/slicepool"
	"github.com/floodgate/floodgate/internal/lib/storekit"
)

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

// Prepare implements floodgate.Store: it prepares limits on the primary
// and, for the Local mode, their local shares on the local store.
func (s *Store) Prepare(limits []core.Spec) (core.Policy, error) {
	if err := storekit.CheckSpecs(limits); err != nil {
		return nil, err
	}
	if s.closed.Load() {
		return nil, floodgate.ErrClosed
	}
	primary, err := s.primary.Prepare(limits)
	if err != nil {
		return nil, err
	}
	p := &policy{s: s, primary: primary, quota: limits[0].Quota, specs: slices.Clone(limits)}
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
