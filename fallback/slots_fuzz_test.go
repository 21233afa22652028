package fallback_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"testing"
	"time"

	"github.com/floodgate/floodgate"
	"github.com/floodgate/floodgate/fallback"
)

// FuzzSlotsOutage runs fuzzed sequences of acquires, releases and extends
// on two keys, in each mode, while the primary fails and recovers (with
// the breaker opening at a fuzzed threshold, or never, and closing by its
// probe), or lands acquires (applies them after failing them), and holds every answer to outageModel, a reference that follows
// the modes as docs/concurrency.md describes them ("On each store",
// Fallback). Beside the model it checks the documented invariants
// directly: the primary never counts more than N permits on a key, a
// permit released is never held again (so a double release is not
// Allowed), and no call panics.
func FuzzSlotsOutage(f *testing.F) {
	// Each op is 3 bytes (see checkOutageSequence): 0 acquires on "a", 8
	// on "b"; 2 and 10 release, 4 and 12 extend; 6 fails the primary
	// (lands acquires with an odd second byte), 7 heals it.
	// Local, N 2 over 2 instances: two local acquires (the second denied),
	// back, a local permit released twice and extended.
	f.Add([]byte{3, 20, 7, 6, 0, 0, 0, 0, 0, 0, 0, 0, 7, 0, 0, 2, 0, 1, 2, 0, 1, 4, 0, 1, 0, 0, 0})
	// FailOpen, N 1: granted while failing; back, the primary's permit
	// fills the key: extended, held with its own expiry, not held from
	// it on, then forgotten.
	f.Add([]byte{1, 30, 3, 6, 0, 0, 0, 0, 0, 7, 0, 0, 0, 0, 8, 4, 0, 4, 4, 0, 4, 2, 1, 0, 4, 0, 0, 0, 0, 0})
	// FailClosed, N 2, the breaker opening at the first failure: a denial,
	// an ErrStore release, then the probe closing it.
	f.Add([]byte{5, 10, 0, 0, 0, 0, 6, 0, 0, 0, 0, 0, 2, 0, 0, 7, 0, 0, 2, 0, 0, 2, 0, 0})
	// FailOpen, N 3, threshold 2, on "b": grants that open the breaker,
	// renewed through it, moved onto the primary once the probe closes it.
	f.Add([]byte{7, 40, 1, 6, 0, 0, 8, 0, 0, 8, 0, 0, 12, 0, 2, 7, 0, 0, 12, 1, 0, 10, 0, 0, 10, 0, 0, 12, 0, 23})
	// FailOpen, N 1: an acquire that lands on the primary: counted there
	// once, moved by its extend, released there.
	f.Add([]byte{1, 30, 3, 6, 1, 0, 0, 0, 0, 7, 0, 0, 0, 0, 0, 4, 0, 1, 2, 0, 0, 0, 0, 0})
	// Local, N 2: an acquire that lands on the primary and is granted
	// locally: its orphan released on the primary by the next call.
	f.Add([]byte{3, 30, 3, 6, 1, 0, 0, 0, 0, 7, 0, 0, 0, 0, 0, 2, 0, 0, 2, 0, 0})
	// Local, N 4: an acquire that lands, and 40 more on "b", so that more
	// orphans wait than a call releases; the first, released locally, is
	// not held again.
	many := []byte{9, 30, 3, 6, 1, 0, 0, 0, 0}
	for range 40 {
		many = append(many, 8, 0, 0)
	}
	f.Add(append(many, 7, 0, 0, 2, 0, 0, 4, 0, 0, 2, 0, 0))
	f.Fuzz(func(t *testing.T, data []byte) {
		if err := checkOutageSequence(t, data); err != nil {
			t.Fatal(err)
		}
	})
}

// checkOutageSequence decodes data and runs it on a fallback store over a
// flaky memory store and on outageModel, returning the first difference.
// data[0]: the mode (mod 3) and N (1 to 4); data[1]: the lease (1 to
// 50ms); data[2]: the breaker's threshold (1, 2, 3 or never) and
// Instances (1 to 3); then 3 bytes an op: its kind and key, a permit, and
// a step of the clock (0 to 23 sixteenths of the lease).
func checkOutageSequence(t *testing.T, data []byte) error {
	if len(data) < 3 {
		return nil
	}
	modes := [...]fallback.Mode{fallback.Local, fallback.FailOpen, fallback.FailClosed}
	m := &outageModel{
		mode:      modes[data[0]%3],
		n:         int64(data[0]/3%4) + 1,
		lease:     (time.Duration(data[1]%50+1) * time.Millisecond).Microseconds(),
		threshold: [...]int64{1, 2, 3, 1 << 30}[data[2]%4],
		primary:   map[string]map[string]int64{},
		local:     map[string]map[string]int64{},
		orphans:   map[[2]string]bool{},
	}
	instances := int64(data[2]/4%3) + 1
	m.share = max(1, m.n/instances)
	m.interval = m.lease / 2
	data = data[3:]

	clock := newGateClock()
	primary := &flaky{Store: floodgate.NewMemoryStore(&floodgate.MemoryOptions{Clock: clock, SweepInterval: -1})}
	defer primary.Store.Close()
	local := floodgate.NewMemoryStore(&floodgate.MemoryOptions{Clock: clock, SweepInterval: -1})
	defer local.Close()
	states := make(chan fallback.State, 4)
	store := fallback.New(primary, &fallback.Options{Mode: m.mode, Instances: instances, Budget: -1, Threshold: int(m.threshold),
		ProbeInterval: time.Duration(m.interval) * time.Microsecond, Local: local, Clock: clock,
		Logger: slog.New(slog.DiscardHandler), OnSwitch: func(s fallback.State) { states <- s }})
	defer store.Close()
	lease := time.Duration(m.lease) * time.Microsecond
	c, err := floodgate.NewConcurrency(store, m.n, lease, nil)
	if err != nil {
		return err
	}
	// direct looks at the primary's own count, under the fallback.
	direct, err := floodgate.NewConcurrency(primary.Store, m.n, lease, nil)
	if err != nil {
		return err
	}
	ctx := context.Background()
	keys := [...]string{"a", "b"}
	var permits []floodgate.Permit
	released := map[floodgate.Permit]bool{}
	for i := 0; i+2 < len(data) && i < 3*200; i += 3 {
		b0, b1, b2 := data[i], data[i+1], data[i+2]
		clock.Advance(lease / 16 * time.Duration(b2%24))
		key := keys[int(b0/8)%len(keys)]
		var (
			got floodgate.SlotResult
			p   floodgate.Permit
			op  string
		)
		switch b0 % 8 {
		case 0, 1:
			op = "acquire"
			got, err = c.Acquire(ctx, key)
			p = got.Permit
			if err == nil && got.Allowed {
				permits = append(permits, p)
			} else {
				// The denied acquire's id is not told; the model's stands
				// for it where it is kept (a landing primary, an orphan).
				p = floodgate.Permit{Key: key, ID: fmt.Sprint("denied-", i)}
			}
		case 2, 3, 4, 5:
			if len(permits) == 0 {
				continue
			}
			p = permits[int(b1)%len(permits)]
			key = p.Key
			op = "release"
			if b0%8 >= 4 {
				op = "extend"
				got, err = c.Extend(ctx, p)
			} else {
				got, err = c.Release(ctx, p)
			}
			if err == nil && got.Allowed && released[p] {
				return fmt.Errorf("op %d: %s of %s, released before: Allowed", i/3, op, p.ID)
			}
			if err == nil && got.Allowed && op == "release" {
				released[p] = true
			}
		case 6:
			// Failing, or, with an odd permit byte, landing: a server that
			// applies an acquire after the caller gave up.
			m.primaryMode = failing + mode(b1%2)*(landing-failing)
			primary.mode.Store(int32(m.primaryMode))
			continue
		case 7:
			m.primaryMode = healthy
			primary.mode.Store(int32(healthy))
			if m.open {
				// The probe loop, asleep for a probe interval, probes the
				// healthy primary and closes the breaker.
				clock.tick(t)
				if err := awaitState(states, fallback.Primary); err != nil {
					return fmt.Errorf("op %d: recovery: %w", i/3, err)
				}
				m.open, m.fails = false, 0
			}
			continue
		}
		now := clock.Now().UnixMicro()
		wasOpen := m.open
		want := m.apply(op, key, p.ID, now)
		if m.inexact {
			// The primary's permits are not known (see outageModel): the
			// invariants above and below hold all the same.
		} else if want.err {
			if !errors.Is(err, floodgate.ErrStore) {
				return fmt.Errorf("op %d: %s on %s at %d: got %+v, %v; want an error wrapping ErrStore", i/3, op, key, now, got, err)
			}
		} else if err != nil || got.Allowed != want.allowed || got.Source != want.source || got.Held != want.held ||
			got.RetryAfter != time.Duration(want.retry)*time.Microsecond || !got.Permit.Expires.Equal(want.expires()) {
			return fmt.Errorf("op %d: %s on %s at %d (%s, N %d, share %d, breaker open %v, primary %d): got %+v, %v; want %+v",
				i/3, op, key, now, m.mode, m.n, m.share, m.open, m.primaryMode, got, err, want)
		}
		// The breaker opens when the model says, and the op switched it
		// (OnSwitch runs in the op's goroutine).
		switched := false
		select {
		case st := <-states:
			switched = st == fallback.Degraded
		default:
		}
		if opened := m.open && !wasOpen; opened != switched {
			return fmt.Errorf("op %d: %s on %s: the breaker opened: %v; the model's: %v", i/3, op, key, switched, opened)
		}
		if err := m.checkLooks(ctx, c, direct, now); err != nil {
			return fmt.Errorf("op %d: %s on %s: %w", i/3, op, key, err)
		}
	}
	return nil
}

// awaitState waits for the switch to want.
func awaitState(states <-chan fallback.State, want fallback.State) error {
	for {
		select {
		case st := <-states:
			if st == want {
				return nil
			}
		case <-time.After(5 * time.Second):
			return fmt.Errorf("no switch to %v", want)
		}
	}
}

// outageModel is the fallback's concurrency limits as docs/concurrency.md
// describes them, on one process: the primary's permits, the local
// store's (Local), the permits FailOpen granted and remembers in the
// order they were granted or renewed, the acquires that failed on the
// primary (orphans, released there by its next call), and the breaker.
// A call releases at most 16 orphans, in an order that failed releases
// shuffle; with more, the model no longer knows the primary's permits,
// and is inexact from then on: only the invariants are checked.
type outageModel struct {
	mode                      fallback.Mode
	n, share, lease, interval int64
	threshold, fails          int64
	open                      bool
	primaryMode               mode                        // healthy, failing or landing
	primary, local            map[string]map[string]int64 // key → id → expiry
	granted                   []openGrant
	orphans                   map[[2]string]bool // key, id
	inexact                   bool
}

// openGrant is a permit that FailOpen granted; maybe says that the
// primary may hold it too (a call about it failed there).
type openGrant struct {
	key, id string
	expiry  int64
	maybe   bool
}

// modelAnswer is what the model says an op answers.
type modelAnswer struct {
	allowed             bool
	held, expiry, retry int64
	source              floodgate.Source
	err                 bool // an error wrapping ErrStore
	dup                 bool // an acquire of a permit held already
}

// expires is the expiry of the permit that a acquires or extends; the
// zero Time when it gives none.
func (a modelAnswer) expires() time.Time {
	if a.expiry == 0 {
		return time.Time{}
	}
	return time.UnixMicro(a.expiry)
}

// live is key's permits in m live at now, the expired dropped.
func live(m map[string]map[string]int64, key string, now int64) map[string]int64 {
	if m[key] == nil {
		m[key] = map[string]int64{}
	}
	for id, e := range m[key] {
		if e <= now {
			delete(m[key], id)
		}
	}
	return m[key]
}

// step applies op to a store's permits of key with n slots, as
// slot.Spec.Step does.
func (m *outageModel) step(store map[string]map[string]int64, n int64, op, key, id string, now int64, src floodgate.Source) modelAnswer {
	held := live(store, key, now)
	a := modelAnswer{source: src}
	e, ok := held[id]
	switch {
	case op == "acquire" && ok:
		a.dup = true
	case op == "acquire" && int64(len(held)) < n:
		held[id] = now + m.lease
		a.allowed, a.expiry = true, now+m.lease
	case op == "acquire":
		first := int64(-1)
		for _, e := range held {
			if first < 0 || e < first {
				first = e
			}
		}
		a.retry = first - now
	case op == "release" && ok:
		delete(held, id)
		a.allowed = true
	case op == "extend" && ok:
		held[id] = max(e, now+m.lease)
		a.allowed, a.expiry = true, held[id]
	}
	a.held = int64(len(held))
	return a
}

// call is a call to the primary while the breaker is closed: the
// orphans' releases first, then op; ok is false when the primary fails
// (a landing primary applies an acquire all the same).
func (m *outageModel) call(op, key, id string, now int64) (a modelAnswer, ok bool) {
	if m.primaryMode == healthy {
		if len(m.orphans) > 16 {
			m.inexact = true
		}
		for o := range m.orphans {
			m.step(m.primary, m.n, "release", o[0], o[1], now, 0)
		}
		clear(m.orphans)
		m.fails = 0
		return m.step(m.primary, m.n, op, key, id, now, floodgate.SourceStore), true
	}
	if m.primaryMode == landing && op == "acquire" {
		m.step(m.primary, m.n, op, key, id, now, 0)
	}
	if m.fails++; m.fails >= m.threshold {
		m.open = true
	}
	return modelAnswer{}, false
}

// grant remembers a FailOpen permit as the newest, first forgetting
// those at the front (the oldest) that expired at now.
func (m *outageModel) grant(g openGrant, now int64) {
	m.forget(g.key, g.id)
	for len(m.granted) > 0 && m.granted[0].expiry <= now {
		m.granted = m.granted[1:]
	}
	m.granted = append(m.granted, g)
}

func (m *outageModel) forget(key, id string) {
	for i, g := range m.granted {
		if g.key == key && g.id == id {
			m.granted = append(m.granted[:i:i], m.granted[i+1:]...)
			return
		}
	}
}

func (m *outageModel) apply(op, key, id string, now int64) modelAnswer {
	if op != "acquire" && m.mode == fallback.Local {
		// A local permit is released and extended where it was granted.
		if a := m.step(m.local, m.share, op, key, id, now, floodgate.SourceLocal); a.allowed {
			return a
		}
	}
	if op != "acquire" && m.mode == fallback.FailOpen {
		if a, ok := m.applyGranted(op, key, id, now); ok {
			return a
		}
	}
	tried := false
	if !m.open {
		// An orphan's release or extend releases it: its permit ended
		// where it was granted.
		ref := [2]string{key, id}
		if claimed := op != "acquire" && m.orphans[ref]; claimed {
			delete(m.orphans, ref)
			if a, ok := m.call("release", key, id, now); ok {
				return modelAnswer{held: a.held, source: floodgate.SourceStore}
			}
			m.orphans[ref] = true
			return modelAnswer{err: true}
		}
		if a, ok := m.call(op, key, id, now); ok {
			return a
		}
		tried = true
		if op == "acquire" && m.mode != fallback.FailOpen {
			m.orphans[[2]string{key, id}] = true
		}
	}
	if op != "acquire" {
		// Only the primary holds the permit, and it fails.
		return modelAnswer{err: true}
	}
	switch m.mode {
	case fallback.FailOpen:
		m.grant(openGrant{key, id, now + m.lease, tried}, now)
		return modelAnswer{allowed: true, expiry: now + m.lease, source: floodgate.SourceFailOpen}
	case fallback.FailClosed:
		return modelAnswer{held: m.n, retry: m.interval, source: floodgate.SourceFailClosed}
	}
	return m.step(m.local, m.share, op, key, id, now, floodgate.SourceLocal)
}

// applyGranted releases or extends a permit that FailOpen granted, as
// docs/concurrency.md says; ok is false when it is not one.
func (m *outageModel) applyGranted(op, key, id string, now int64) (modelAnswer, bool) {
	at := -1
	for i, g := range m.granted {
		if g.key == key && g.id == id {
			at = i
		}
	}
	if at < 0 {
		return modelAnswer{}, false
	}
	g := m.granted[at]
	switch {
	case g.expiry <= now:
		m.forget(key, id)
		return modelAnswer{source: floodgate.SourceFailOpen}, true
	case op == "release":
		m.forget(key, id)
		if g.maybe {
			m.orphans[[2]string{key, id}] = true
		}
		return modelAnswer{allowed: true, source: floodgate.SourceFailOpen}, true
	}
	if !m.open {
		// Acquired on the primary under its id, when it has room; renewed
		// there when it holds it already (its acquire landed).
		a, ok := m.call("acquire", key, id, now)
		if ok && a.dup {
			a = m.step(m.primary, m.n, "extend", key, id, now, floodgate.SourceStore)
		}
		switch {
		case ok && a.allowed:
			m.forget(key, id)
			return a, true
		case ok:
			return modelAnswer{allowed: true, held: a.held, expiry: g.expiry, source: floodgate.SourceFailOpen}, true
		}
		g.maybe = true
	}
	g.expiry = max(g.expiry, now+m.lease)
	m.grant(g, now)
	return modelAnswer{allowed: true, expiry: g.expiry, source: floodgate.SourceFailOpen}, true
}

// checkLooks checks, on both keys, the primary's own count (never above
// N, and the model's) and what the fallback's inspection reports: the
// primary's slots or the mode's, and beside them the permits that the
// primary does not count (the local store's, or FailOpen's).
func (m *outageModel) checkLooks(ctx context.Context, c, direct *floodgate.Concurrency, now int64) error {
	for _, key := range [...]string{"a", "b"} {
		d, err := direct.Inspect(ctx, key)
		if err != nil {
			return err
		}
		if d.Held > m.n {
			return fmt.Errorf("the primary holds %d permits on %s; N is %d", d.Held, key, m.n)
		}
		if m.inexact {
			continue
		}
		if d.Held != int64(len(live(m.primary, key, now))) {
			return fmt.Errorf("the primary holds %d permits on %s; the model %d", d.Held, key, len(m.primary[key]))
		}
		in, err := c.Inspect(ctx, key)
		if err != nil {
			return err
		}
		var aside int64
		switch m.mode {
		case fallback.Local:
			aside = int64(len(live(m.local, key, now)))
		case fallback.FailOpen:
			for _, g := range m.granted {
				if g.key == key && g.expiry > now {
					aside++
				}
			}
		}
		// A landing primary answers looks.
		degraded := m.open || m.primaryMode == failing
		held, src := d.Held, floodgate.SourceStore
		if degraded {
			switch m.mode {
			case fallback.Local:
				held, src = aside, floodgate.SourceLocal
			case fallback.FailOpen:
				held, src = 0, floodgate.SourceFailOpen
			case fallback.FailClosed:
				held, src = m.n, floodgate.SourceFailClosed
			}
		}
		fb := in.Fallback
		if in.Held != held || in.Source != src || fb == nil || fb.Degraded != degraded || fb.LocalHeld != aside {
			return fmt.Errorf("inspection of %s: %+v, fallback %+v; want %d held from %v, %d beside", key, in, fb, held, src, aside)
		}
	}
	return nil
}
