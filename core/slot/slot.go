package slot

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/floodgate/floodgate/core"
)

// The bounds on a concurrency limit.
const (
	// MaxSlots is the most slots one key may have. A key holds one record
	// per live permit (in Redis, a sorted set member each), so N bounds
	// the work of one operation and the memory of one key.
	MaxSlots = 10000
	// MaxPermitIDLen is the longest permit id that a store accepts (the
	// ids that floodgate.Concurrency makes are floodgate.PermitIDLen
	// bytes), so the most a store keeps of one: Spec.Step rejects a
	// longer one.
	MaxPermitIDLen = 64
)

// ErrInvalidPermit reports a permit id that no store could have issued
// for the key: empty, too long, malformed, or issued for another key.
// floodgate.IsInvalidInput is true of it. A well-formed permit that is not (or no
// longer) held is not an error: Release and Extend report it as not held.
var ErrInvalidPermit = errors.New("floodgate: invalid permit")

// Spec is a concurrency limit compiled for deciding: N slots per key,
// each held for a lease of Lease µs unless released or extended. Build one
// with New. A Spec is an immutable value, safe to copy and share.
type Spec struct {
	// Name labels the limit in results and metrics; it has no effect on
	// decisions.
	Name string
	// Slots is N, the most permits held at once on a key: 1 to MaxSlots.
	Slots int64
	// Lease is how long a permit lives without Extend, in µs: 1 to
	// core.MaxPeriod.
	Lease int64
}

// New returns the Spec of n slots per key with the given lease. The
// error wraps core.ErrInvalidLimit: n must be 1 to MaxSlots, the lease a
// positive whole number of microseconds up to core.MaxPeriod.
func New(n int64, lease time.Duration) (Spec, error) {
	if n < 1 || n > MaxSlots {
		return Spec{}, fmt.Errorf("%w: concurrency limit must be between 1 and %d slots, got %d", core.ErrInvalidLimit, MaxSlots, n)
	}
	l, err := checkLease(lease)
	if err != nil {
		return Spec{}, err
	}
	return Spec{Slots: n, Lease: l}, nil
}

// maxLease is core.MaxPeriod in µs.
const maxLease = int64(core.MaxPeriod / time.Microsecond)

// checkLease returns the lease in µs, or an error wrapping
// core.ErrInvalidLimit, with the bounds and words of core's periods.
func checkLease(lease time.Duration) (int64, error) {
	switch {
	case lease <= 0:
		return 0, fmt.Errorf("%w: concurrency lease period must be positive, got %s", core.ErrInvalidLimit, lease)
	case lease%time.Microsecond != 0:
		return 0, fmt.Errorf("%w: concurrency lease period must be a whole number of microseconds, got %s", core.ErrInvalidLimit, lease)
	case lease > core.MaxPeriod:
		return 0, fmt.Errorf("%w: concurrency lease period must be at most %s, got %s", core.ErrInvalidLimit, core.MaxPeriod, lease)
	}
	return int64(lease / time.Microsecond), nil
}

// Validate returns nil when s is a Spec that New could have returned,
// and an error wrapping core.ErrInvalidLimit otherwise.
func (s Spec) Validate() error {
	if s.Lease > maxLease {
		return fmt.Errorf("%w: concurrency lease must be at most %s, got %dµs", core.ErrInvalidLimit, core.MaxPeriod, s.Lease)
	}
	_, err := New(s.Slots, time.Duration(s.Lease)*time.Microsecond)
	return err
}

// Share returns the 1/n share of s that one of n processes may hold on
// its own: N/n slots, rounded down but at least 1, with the same lease.
// A fallback store's local limiter applies it while Redis is away.
func (s Spec) Share(n int64) (Spec, error) {
	if n < 1 {
		return Spec{}, fmt.Errorf("%w: share must be of 1 or more instances, got %d", core.ErrInvalidLimit, n)
	}
	s.Slots = max(1, s.Slots/n)
	return s, nil
}

// OpKind is what a Op does.
type OpKind uint8

// The slot operations. The zero OpKind is none.
const (
	// Acquire takes a slot for the permit ID if fewer than N are held.
	Acquire OpKind = iota + 1
	// Release gives back the permit ID's slot, if it is held.
	Release
	// Extend renews the permit ID for another lease, if it is held.
	Extend
)

// String returns "acquire", "release" or "extend".
func (k OpKind) String() string {
	switch k {
	case Acquire:
		return "acquire"
	case Release:
		return "release"
	case Extend:
		return "extend"
	}
	return fmt.Sprintf("OpKind(%d)", uint8(k))
}

// Op is one operation on a key's slots: its kind and the permit id it
// is about (for Acquire, the id the new permit gets).
type Op struct {
	Kind OpKind
	ID   string
}

// Permit is one live permit as a store keeps it: its id and its expiry,
// in µs since the epoch.
type Permit struct {
	ID     string
	Expiry int64
}

// State is one key's slots: the permits held, in the order they were
// acquired, expired ones included until an operation drops them. The
// zero State holds nothing.
type State struct {
	Permits []Permit
}

// Live returns how many permits of st have not expired at now.
func (st State) Live(now int64) int64 {
	var n int64
	for _, p := range st.Permits {
		if p.Expiry > now {
			n++
		}
	}
	return n
}

// Verdict is the answer to one Op.
type Verdict struct {
	// OK says the operation did what it asked: Acquire took a slot,
	// Release gave one back, Extend renewed the permit. A Release or
	// Extend of a permit that is not held (released already, expired,
	// never acquired) is not OK and changes nothing.
	OK bool
	// Held is how many permits are live after the operation.
	Held int64
	// Expiry is the permit's expiry (µs since the epoch) after an OK
	// Acquire or Extend; 0 otherwise.
	Expiry int64
	// Retry is, for a denied Acquire, the µs until the earliest live
	// permit expires: when a slot frees at the latest, sooner if one is
	// released. 0 otherwise.
	Retry int64
}

// Step applies op to the slots st of one key at time now (µs) and
// returns the new state and the verdict; st is not changed. It is a pure
// function, the model every store mirrors:
//
//   - Expired permits (Expiry <= now) are dropped first: a permit lives
//     for the half-open interval [acquired, Expiry).
//   - Acquire: with fewer than Slots live permits, adds op.ID expiring at
//     now + Lease; otherwise denies with Retry = earliest expiry - now.
//     Acquiring an id that is held already is an error (ids are random;
//     it means a forged or replayed id).
//   - Release: removes op.ID if held; not OK if not.
//   - Extend: sets op.ID's expiry to the later of now + Lease and its
//     expiry (a clock that steps back never shortens a lease); not OK if
//     not held.
//
// Errors wrap ErrInvalidPermit (an empty id, or one longer than
// MaxPermitIDLen, rejected before the key is looked at; or a duplicate
// acquire) or core.ErrInvalidLimit (an unknown op kind).
func (s Spec) Step(st State, now int64, op Op) (State, Verdict, error) {
	if err := checkIDShape(op.ID); err != nil {
		return st, Verdict{}, err
	}
	live := make([]Permit, 0, len(st.Permits)+1)
	at := -1
	for _, p := range st.Permits {
		if p.Expiry > now {
			if p.ID == op.ID {
				at = len(live)
			}
			live = append(live, p)
		}
	}
	var v Verdict
	switch op.Kind {
	case Acquire:
		if at >= 0 {
			return st, Verdict{}, fmt.Errorf("%w: permit %q is held already", ErrInvalidPermit, op.ID)
		}
		if int64(len(live)) >= s.Slots {
			earliest := live[0].Expiry
			for _, p := range live[1:] {
				earliest = min(earliest, p.Expiry)
			}
			v.Retry = earliest - now
			break
		}
		v.OK, v.Expiry = true, now+s.Lease
		live = append(live, Permit{ID: op.ID, Expiry: v.Expiry})
	case Release:
		if at >= 0 {
			v.OK = true
			live = slices.Delete(live, at, at+1)
		}
	case Extend:
		if at >= 0 {
			v.OK = true
			live[at].Expiry = max(live[at].Expiry, now+s.Lease)
			v.Expiry = live[at].Expiry
		}
	default:
		return st, Verdict{}, fmt.Errorf("%w: unknown slot operation %d", core.ErrInvalidLimit, op.Kind)
	}
	v.Held = int64(len(live))
	if len(live) == 0 {
		live = nil
	}
	return State{Permits: live}, v, nil
}

// Hold returns how long the key must be kept after now: until its latest
// permit expires; 0 when it holds none.
func (st State) Hold(now int64) int64 {
	var h int64
	for _, p := range st.Permits {
		h = max(h, p.Expiry-now)
	}
	return h
}

// checkIDShape bounds an id before anything stores or compares it.
func checkIDShape(id string) error {
	switch {
	case id == "":
		return fmt.Errorf("%w: empty permit id", ErrInvalidPermit)
	case len(id) > MaxPermitIDLen:
		return fmt.Errorf("%w: permit id is %d bytes, more than the maximum %d", ErrInvalidPermit, len(id), MaxPermitIDLen)
	}
	return nil
}

// Store is implemented by a core.Store that keeps concurrency limits:
// the memory store, the Redis store and the fallback store. It is
// optional; package floodgate's NewConcurrency reports a store without
// it.
type Store interface {
	// PrepareSlots validates spec and returns the Policy that applies
	// it. It does no I/O. Its errors wrap core.ErrInvalidLimit or
	// core.ErrClosed.
	PrepareSlots(spec Spec) (Policy, error)
}

// Policy applies one concurrency limit to keys.
type Policy interface {
	// Slot applies op to key's slots, atomically, at the store's time, as
	// Spec.Step does, and returns its verdict. Errors: for bad input,
	// core.ErrInvalidKey (a key that core.Policy's Take would refuse),
	// ErrInvalidPermit (an id that Spec.Step refuses;
	// floodgate.Concurrency checks the form of the ids it makes before it
	// calls Slot) or core.ErrInvalidLimit (an unknown op kind); the
	// context's, core.ErrStore (core.ErrKey for that key alone),
	// core.ErrClosed. A denied acquire, or a release of a permit not held, is a verdict, not an
	// error. A store that fails may or may not have applied the op: an
	// acquire's permit then expires after its lease at the latest.
	Slot(ctx context.Context, key string, op Op) (Verdict, core.Source, error)
}

// Inspector is implemented by a Policy that can report a key's slots
// without changing them, as the memory, Redis and fallback stores'
// do. It is for explaining decisions (floodgate serve's explain API), not
// for making them: another process may take or give back a slot the
// moment after.
type Inspector interface {
	// InspectSlots reports key's live permits at the store's time,
	// changing nothing: expired permits are not dropped, a key's TTL is
	// not touched. Errors: core.ErrInvalidKey (a key that core.Policy's
	// Take would refuse), the context's, core.ErrStore (core.ErrKey for
	// that key alone), core.ErrClosed.
	InspectSlots(ctx context.Context, key string) (Inspection, error)
}

// Inspection is what Inspector.InspectSlots reports of a key.
type Inspection struct {
	// Now is the store's time of the look, µs since the epoch.
	Now int64
	// Held is how many permits are live at Now.
	Held int64
	// Earliest is the expiry (µs since the epoch) of the live permit that
	// expires first: when a slot frees at the latest, unless one is
	// released sooner. 0 when none is held.
	Earliest int64
	// Source says who answered: the store, or a fallback's mode while
	// its primary fails.
	Source core.Source
	// Fallback is set by a fallback store; nil otherwise.
	Fallback *FallbackInspection
}

// FallbackInspection is what a fallback store reports of a key's
// slots besides its primary's.
type FallbackInspection struct {
	// Mode is the failure mode: "local", "fail-open" or "fail-closed".
	Mode string
	// Degraded reports that the key's primary is failing (its breaker is
	// open, or it failed to answer the look): the mode answers acquires.
	Degraded bool
	// Instances is how many processes share the limit: the local store
	// holds N/Instances slots (at least 1) while the primary fails.
	Instances int64
	// Local is the local store's slots of the key, in the local mode:
	// permits granted while the primary failed, held until released or
	// expired even once it answers again. In the fail-open mode, the
	// permits this process granted open and still remembers, which the
	// primary does not count. Nil in the fail-closed mode.
	Local *Inspection
}

// InspectState is what a store that keeps st holds for the key at now:
// its live permits and the earliest expiry among them.
func (st State) InspectState(now int64) Inspection {
	in := Inspection{Now: now}
	for _, p := range st.Permits {
		if p.Expiry > now {
			in.Held++
			if in.Earliest == 0 || p.Expiry < in.Earliest {
				in.Earliest = p.Expiry
			}
		}
	}
	return in
}
