package fallback

import (
	"context"
	"errors"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/floodgate/floodgate"
	"github.com/floodgate/floodgate/core"
)

// This file is the breaker: the budget of a call to the primary, the
// switches between the primary and the mode, and the probes that bring
// decisions back to the primary.

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

// probeSpec never denies a probe: it exists so that a probe runs the same
// script, and writes, as a decision does.
func probeSpec() core.Spec {
	s, err := core.NewBucket("probe", core.MaxQuota, time.Second, core.MaxQuota, "burst")
	if err != nil {
		panic(err) // constant, valid parameters
	}
	return s
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
