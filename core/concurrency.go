package core

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"
)

// Concurrency limits (slots) bound how many requests on a key are in
// flight at once, where the rate limits bound how often. A SlotSpec is N
// slots per key with a lease L; Acquire takes a slot and returns a permit
// (an id and an expiry), Release gives it back exactly once, Extend renews
// it for another L, and a permit neither released nor extended within L
// frees its slot by itself, so a holder that dies loses its slots at most
// L later and never sooner.
//
// Slots are their own type rather than a Kind of Spec, because they share
// nothing of a rate limit's contract but the key: an acquire returns a
// permit that only its holder can give back, and release and extend name
// that permit, where every Policy method takes a key and a cost. As a
// Kind, every Store, the Lua protocol, overrides, carries, rebases,
// refunds, forced charges, leases and the denial cache would each need a
// meaning for "slots" that they do not have (what is a refund of a permit
// nobody named, or a forced charge over N?), and every Take would carry a
// permit id it does not use. A separate SlotStore keeps the rate limits'
// contract as it is and gives the slots the three operations they need.

// The bounds on a concurrency limit.
const (
	// MaxSlots is the most slots one key may have. A key holds one record
	// per live permit (in Redis, a sorted set member each), so N bounds
	// the work of one operation and the memory of one key.
	MaxSlots = 10000
	// MaxPermitIDLen is the longest permit id that a store accepts (the
	// ids that floodgate.Concurrency makes are floodgate.PermitIDLen
	// bytes), so the most a store keeps of one: SlotSpec.Step rejects a
	// longer one.
	MaxPermitIDLen = 64
)

// ErrInvalidPermit reports a permit id that no store could have issued
// for the key: empty, too long, malformed, or issued for another key.
// floodgate.IsInvalidInput is true of it. A well-formed permit that is not (or no
// longer) held is not an error: Release and Extend report it as not held.
var ErrInvalidPermit = errors.New("floodgate: invalid permit")

// SlotSpec is a concurrency limit compiled for deciding: N slots per key,
// each held for a lease of Lease µs unless released or extended. Build one
// with NewSlots. A SlotSpec is an immutable value, safe to copy and share.
type SlotSpec struct {
	// Name labels the limit in results and metrics; it has no effect on
	// decisions.
	Name string
	// Slots is N, the most permits held at once on a key: 1 to MaxSlots.
	Slots int64
	// Lease is how long a permit lives without Extend, in µs: 1 to
	// MaxPeriod.
	Lease int64
}

// NewSlots returns the SlotSpec of n slots per key with the given lease.
// The error wraps ErrInvalidLimit: n must be 1 to MaxSlots, the lease a
// positive whole number of microseconds up to MaxPeriod.
func NewSlots(n int64, lease time.Duration) (SlotSpec, error) {
	if n < 1 || n > MaxSlots {
		return SlotSpec{}, fmt.Errorf("%w: concurrency limit must be between 1 and %d slots, got %d", ErrInvalidLimit, MaxSlots, n)
	}
	l, err := checkPeriod("concurrency lease", lease)
	if err != nil {
		return SlotSpec{}, err
	}
	return SlotSpec{Slots: n, Lease: l}, nil
}

// Validate returns nil when s is a SlotSpec that NewSlots could have
// returned, and an error wrapping ErrInvalidLimit otherwise.
func (s SlotSpec) Validate() error {
	if s.Lease > maxPeriodMicros {
		return fmt.Errorf("%w: concurrency lease must be at most %s, got %dµs", ErrInvalidLimit, MaxPeriod, s.Lease)
	}
	_, err := NewSlots(s.Slots, time.Duration(s.Lease)*time.Microsecond)
	return err
}

// Share returns the 1/n share of s that one of n processes may hold on
// its own: N/n slots, rounded down but at least 1, with the same lease.
// A fallback store's local limiter applies it while Redis is away.
func (s SlotSpec) Share(n int64) (SlotSpec, error) {
	if n < 1 {
		return SlotSpec{}, fmt.Errorf("%w: share must be of 1 or more instances, got %d", ErrInvalidLimit, n)
	}
	s.Slots = max(1, s.Slots/n)
	return s, nil
}

// SlotOpKind is what a SlotOp does.
type SlotOpKind uint8

// The slot operations. The zero SlotOpKind is none.
const (
	// Acquire takes a slot for the permit ID if fewer than N are held.
	Acquire SlotOpKind = iota + 1
	// Release gives back the permit ID's slot, if it is held.
	Release
	// Extend renews the permit ID for another lease, if it is held.
	Extend
)

// String returns "acquire", "release" or "extend".
func (k SlotOpKind) String() string {
	switch k {
	case Acquire:
		return "acquire"
	case Release:
		return "release"
	case Extend:
		return "extend"
	}
	return fmt.Sprintf("SlotOpKind(%d)", uint8(k))
}

// SlotOp is one operation on a key's slots: its kind and the permit id it
// is about (for Acquire, the id the new permit gets).
type SlotOp struct {
	Kind SlotOpKind
	ID   string
}

// Held is one live permit: its id and its expiry, in µs since the epoch.
type Held struct {
	ID     string
	Expiry int64
}

// SlotState is one key's slots: the permits held, in the order they were
// acquired, expired ones included until an operation drops them. The
// zero SlotState holds nothing.
type SlotState struct {
	Permits []Held
}

// Live returns how many permits of st have not expired at now.
func (st SlotState) Live(now int64) int64 {
	var n int64
	for _, p := range st.Permits {
		if p.Expiry > now {
			n++
		}
	}
	return n
}

// SlotVerdict is the answer to one SlotOp.
type SlotVerdict struct {
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
// acquire) or ErrInvalidLimit (an unknown op kind).
func (s SlotSpec) Step(st SlotState, now int64, op SlotOp) (SlotState, SlotVerdict, error) {
	if err := checkIDShape(op.ID); err != nil {
		return st, SlotVerdict{}, err
	}
	live := make([]Held, 0, len(st.Permits)+1)
	at := -1
	for _, p := range st.Permits {
		if p.Expiry > now {
			if p.ID == op.ID {
				at = len(live)
			}
			live = append(live, p)
		}
	}
	var v SlotVerdict
	switch op.Kind {
	case Acquire:
		if at >= 0 {
			return st, SlotVerdict{}, fmt.Errorf("%w: permit %q is held already", ErrInvalidPermit, op.ID)
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
		live = append(live, Held{ID: op.ID, Expiry: v.Expiry})
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
		return st, SlotVerdict{}, fmt.Errorf("%w: unknown slot operation %d", ErrInvalidLimit, op.Kind)
	}
	v.Held = int64(len(live))
	if len(live) == 0 {
		live = nil
	}
	return SlotState{Permits: live}, v, nil
}

// Hold returns how long the key must be kept after now: until its latest
// permit expires; 0 when it holds none.
func (st SlotState) Hold(now int64) int64 {
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

// SlotStore is implemented by a Store that keeps concurrency limits: the
// memory store, the Redis store and the fallback store. It is optional;
// package floodgate's NewConcurrency reports a store without it.
type SlotStore interface {
	// PrepareSlots validates spec and returns the SlotPolicy that applies
	// it. It does no I/O. Its errors wrap ErrInvalidLimit or ErrClosed.
	PrepareSlots(spec SlotSpec) (SlotPolicy, error)
}

// SlotPolicy applies one concurrency limit to keys.
type SlotPolicy interface {
	// Slot applies op to key's slots, atomically, at the store's time, as
	// SlotSpec.Step does, and returns its verdict. Errors: for bad input,
	// ErrInvalidKey (a key that Take would refuse), ErrInvalidPermit (an
	// id that SlotSpec.Step refuses; floodgate.Concurrency checks the
	// form of the ids it makes before it calls Slot) or ErrInvalidLimit
	// (an unknown op kind); the context's, ErrStore (ErrKey for that key alone), ErrClosed. A denied
	// acquire, or a release of a permit not held, is a verdict, not an
	// error. A store that fails may or may not have applied the op: an
	// acquire's permit then expires after its lease at the latest.
	Slot(ctx context.Context, key string, op SlotOp) (SlotVerdict, Source, error)
}

// SlotInspector is implemented by a SlotPolicy that can report a key's
// slots without changing them, as the memory, Redis and fallback stores'
// do. It is for explaining decisions (floodgate serve's explain API), not
// for making them: another process may take or give back a slot the
// moment after.
type SlotInspector interface {
	// InspectSlots reports key's live permits at the store's time,
	// changing nothing: expired permits are not dropped, a key's TTL is
	// not touched. Errors: ErrInvalidKey (a key that Take would refuse),
	// the context's, ErrStore (ErrKey for that key alone), ErrClosed.
	InspectSlots(ctx context.Context, key string) (SlotInspection, error)
}

// SlotInspection is what SlotInspector.InspectSlots reports of a key.
type SlotInspection struct {
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
	Source Source
	// Fallback is set by a fallback store; nil otherwise.
	Fallback *SlotFallbackInspection
}

// SlotFallbackInspection is what a fallback store reports of a key's
// slots besides its primary's.
type SlotFallbackInspection struct {
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
	Local *SlotInspection
}

// InspectState is what a store that keeps st holds for the key at now:
// its live permits and the earliest expiry among them.
func (st SlotState) InspectState(now int64) SlotInspection {
	in := SlotInspection{Now: now}
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
