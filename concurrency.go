package floodgate

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"time"

	"github.com/floodgate/floodgate/core/slot"
	"github.com/floodgate/floodgate/internal/lib/storekit"
)

// ErrInvalidPermit reports a permit id that no store could have issued
// for the key: empty, too long, malformed, or issued for another key. A
// permit that is well formed but not held is no error: Release and Extend
// report it. It is slot.ErrInvalidPermit.
var ErrInvalidPermit = slot.ErrInvalidPermit

// The bounds on a concurrency limit.
const (
	// MaxSlots is the most slots a Concurrency limit may have per key.
	MaxSlots = slot.MaxSlots
	// MaxPermitIDLen is the longest permit id a store accepts.
	MaxPermitIDLen = slot.MaxPermitIDLen
	// PermitIDLen is the length of the permit ids the stores issue.
	PermitIDLen = storekit.PermitIDLen
)

// Concurrency limits how many requests on a key are in flight at once,
// across every process that shares its store: at most N permits per key,
// each held until released, or for a lease L if it is neither released
// nor extended, so that the slots of a process that died come back at most
// L later, and never sooner.
//
// It is its own type, not a Limit of a Limiter, because its operations are
// not a Limiter's: Acquire returns a permit that only its holder gives
// back (Release) or renews (Extend), where a Limiter's calls take a key
// and a cost. A rate limit and a concurrency limit on one request are
// decided together by AcquireGroup: both pass or neither is charged.
//
// The store must implement slot.Store, as the memory store, the Redis
// store and the fallback store do. A Concurrency is safe for concurrent
// use; Close does not close its store.
type Concurrency struct {
	spec   slot.Spec
	policy slot.Policy
}

// ConcurrencyOptions configures a Concurrency. The zero value (or nil)
// gives the defaults.
type ConcurrencyOptions struct {
	// Name labels the limit in results and metrics. Default: "".
	Name string
}

// NewConcurrency returns a limit of n permits held at once per key, each
// for a lease (a whole number of microseconds, at most MaxPeriod) unless
// released or extended, over store. Its errors wrap ErrInvalidLimit (n
// outside 1 to MaxSlots, a bad lease, a store that keeps no concurrency
// limits) or ErrClosed.
func NewConcurrency(store Store, n int64, lease time.Duration, opts *ConcurrencyOptions) (*Concurrency, error) {
	spec, err := slot.New(n, lease)
	if err != nil {
		return nil, err
	}
	if opts != nil {
		spec.Name = opts.Name
	}
	ss, ok := store.(slot.Store)
	if !ok {
		return nil, fmt.Errorf("%w: the store (%T) keeps no concurrency limits", ErrInvalidLimit, store)
	}
	p, err := ss.PrepareSlots(spec)
	if err != nil {
		return nil, err
	}
	return &Concurrency{spec: spec, policy: p}, nil
}

// Slots returns N, the most permits held at once on a key.
func (c *Concurrency) Slots() int64 { return c.spec.Slots }

// Lease returns how long a permit lives unless released or extended.
func (c *Concurrency) Lease() time.Duration { return time.Duration(c.spec.Lease) * time.Microsecond }

// Name returns the limit's name.
func (c *Concurrency) Name() string { return c.spec.Name }

// Permit is one slot held on a key: give it back with Release, renew it
// with Extend. Its ID is what a client of the service sends back; it is
// random and tagged with the key, so that a permit given for another key
// is an error rather than a silent miss.
type Permit struct {
	// Key is the key the permit is held on.
	Key string
	// ID identifies the permit: PermitIDLen bytes of hex and '-'.
	ID string
	// Expires is when the permit frees its slot by itself, on the store's
	// clock (Redis's, for the Redis store).
	Expires time.Time
	// Source says who granted it: the store, or a fallback's local
	// limiter while Redis was away.
	Source Source
}

// SlotResult is the outcome of Acquire, Release or Extend.
type SlotResult struct {
	// Allowed reports that the operation did what it asked: Acquire took a
	// slot, Release gave one back, Extend renewed the permit. A Release or
	// Extend of a permit not held (released already, expired) is not
	// Allowed and changed nothing.
	Allowed bool
	// Permit is the permit acquired or extended, with its new expiry;
	// the zero Permit otherwise.
	Permit Permit
	// Limit is N, the most permits held at once.
	Limit int64
	// Held is how many permits the key holds after the operation.
	Held int64
	// RetryAfter is, for a denied Acquire, how long until the earliest
	// permit held expires: when a slot frees at the latest (sooner if one
	// is released). 0 otherwise.
	RetryAfter time.Duration
	// Source says who decided.
	Source Source
	// Name is the limit's name.
	Name string
}

// Acquire takes a slot on key if fewer than N are held, and returns its
// permit in the result; a full key is a result that is not Allowed, with
// RetryAfter. Errors: an invalid key (ErrInvalidKey), the context's,
// the store's (ErrStore, ErrClosed). When the store fails the slot may or
// may not have been taken; it is then freed after the lease at the latest.
func (c *Concurrency) Acquire(ctx context.Context, key string) (SlotResult, error) {
	var r [16]byte
	if _, err := rand.Read(r[:]); err != nil {
		return SlotResult{}, fmt.Errorf("%w: no randomness for a permit id: %w", ErrStore, err)
	}
	return c.do(ctx, key, slot.Op{Kind: slot.Acquire, ID: storekit.NewPermitID(key, r)})
}

// Release gives back p's slot, exactly once: the result is Allowed the
// first time, and not Allowed (changing nothing) when p was released
// already or has expired. A permit of another key, or a forged id, is an
// error wrapping ErrInvalidPermit.
func (c *Concurrency) Release(ctx context.Context, p Permit) (SlotResult, error) {
	return c.do(ctx, p.Key, slot.Op{Kind: slot.Release, ID: p.ID})
}

// Extend renews p for another lease from now, for work longer than the
// lease (a stream, an export): the result is Allowed with the permit's new
// expiry, or not Allowed (changing nothing) when p was released already
// or has expired, and the work must then stop or acquire again. Errors
// are Release's.
func (c *Concurrency) Extend(ctx context.Context, p Permit) (SlotResult, error) {
	return c.do(ctx, p.Key, slot.Op{Kind: slot.Extend, ID: p.ID})
}

func (c *Concurrency) do(ctx context.Context, key string, op slot.Op) (SlotResult, error) {
	if err := storekit.CheckSlotOp(key, op); err != nil {
		return SlotResult{}, err
	}
	v, src, err := c.policy.Slot(ctx, key, op)
	if err != nil {
		return SlotResult{}, err
	}
	return c.result(key, op.ID, v, src), nil
}

func (c *Concurrency) result(key, id string, v slot.Verdict, src Source) SlotResult {
	r := SlotResult{Allowed: v.OK, Limit: c.spec.Slots, Held: v.Held, Source: src, Name: c.spec.Name,
		RetryAfter: time.Duration(v.Retry) * time.Microsecond}
	if v.OK && v.Expiry != 0 {
		r.Permit = Permit{Key: key, ID: id, Expires: time.UnixMicro(v.Expiry), Source: src}
	}
	return r
}

// AcquireGroup decides a concurrency limit and rate limits on one
// request as one: it acquires a slot on key, then decides reqs with
// AllowGroup, all or nothing; when a request of reqs is denied (and is
// not Advisory), or fails, it releases the permit, so that either the
// slot and every rate limit are charged, or nothing is. The result is the
// acquire's: not Allowed when the slot or the group was denied; the
// reqs' Results say which. A denied slot decides no request of reqs
// (their Results are left zero).
//
// The slot is taken first because its release is exact, where a refund of
// some rate limits is not (a sliding window counter's); others may see
// the slot held for the moment the group takes, which can deny them, never
// over-admit. Errors are Acquire's and AllowGroup's; on an error nothing
// stays charged but what a failed store may have kept (a permit then
// expires after its lease).
func AcquireGroup(ctx context.Context, c *Concurrency, key string, reqs []Request) (SlotResult, error) {
	res, err := c.Acquire(ctx, key)
	if err != nil || !res.Allowed {
		return res, err
	}
	gerr := AllowGroup(ctx, reqs, true)
	denied := false
	for i := range reqs {
		if gerr == nil && !reqs[i].Result.Allowed && !reqs[i].Advisory {
			denied = true
		}
	}
	if gerr == nil && !denied {
		return res, nil
	}
	rel, rerr := c.Release(context.WithoutCancel(ctx), res.Permit)
	if gerr != nil || rerr != nil {
		return SlotResult{}, errors.Join(gerr, rerr)
	}
	rel.Allowed, rel.Permit = false, Permit{}
	return rel, nil
}

// SlotInspection is what Concurrency.Inspect reports of a key's slots.
type SlotInspection struct {
	// Limit is N, the most permits held at once.
	Limit int64
	// Held is how many permits are live now.
	Held int64
	// FreeAfter is how long until the earliest live permit expires: when
	// a slot frees at the latest, sooner if one is released. 0 when none
	// is held.
	FreeAfter time.Duration
	// Earliest is when that permit expires, on the store's clock; the
	// zero Time when none is held.
	Earliest time.Time
	// Source says who answered: the store, or a fallback's mode.
	Source Source
	// Fallback is set when the store is a fallback store (package
	// fallback); nil otherwise.
	Fallback *FallbackSlotInspection
}

// FallbackSlotInspection is what a fallback store reports of a key's
// slots.
type FallbackSlotInspection struct {
	// Mode is the failure mode: "local", "fail-open" or "fail-closed".
	Mode string
	// Degraded reports that the key's primary is failing: the mode
	// answers acquires.
	Degraded bool
	// Instances is how many processes share the limit.
	Instances int64
	// LocalLimit is the local store's share of N (N/Instances, at least
	// 1), in the local mode; 0 otherwise.
	LocalLimit int64
	// LocalHeld is how many permits the local store holds on the key, in
	// the local mode: granted while the primary failed, held until
	// released or expired. In the fail-open mode, it is how many permits
	// this process granted open on the key and still remembers, which
	// the primary does not count (see fallback's package doc).
	LocalHeld int64
	// LocalFreeAfter is how long until the earliest of them expires; 0
	// when none is held.
	LocalFreeAfter time.Duration
}

// Inspect reports key's live permits and when the earliest expires,
// without changing anything: it is for explaining decisions, not for
// making them, since another process may take or give back a slot the
// moment after. It needs a store whose slots implement
// slot.Inspector, as the memory, Redis and fallback stores' do; with
// another, the error wraps errors.ErrUnsupported. Its other errors are
// Acquire's.
func (c *Concurrency) Inspect(ctx context.Context, key string) (SlotInspection, error) {
	si, ok := c.policy.(slot.Inspector)
	if !ok {
		return SlotInspection{}, fmt.Errorf("floodgate: the store cannot inspect a key's slots: %w", errors.ErrUnsupported)
	}
	if err := storekit.CheckKey(key); err != nil {
		return SlotInspection{}, err
	}
	in, err := si.InspectSlots(ctx, key)
	if err != nil {
		return SlotInspection{}, err
	}
	out := SlotInspection{Limit: c.spec.Slots, Held: in.Held, Source: in.Source}
	out.Earliest, out.FreeAfter = earliest(&in)
	if in.Source == SourceLocal {
		if sh, err := c.spec.Share(max(1, instancesOf(in.Fallback))); err == nil {
			out.Limit = sh.Slots
		}
	}
	if fb := in.Fallback; fb != nil {
		out.Fallback = &FallbackSlotInspection{Mode: fb.Mode, Degraded: fb.Degraded, Instances: fb.Instances}
		if fb.Local != nil {
			if sh, err := c.spec.Share(max(1, fb.Instances)); err == nil && fb.Mode == "local" {
				out.Fallback.LocalLimit = sh.Slots
			}
			out.Fallback.LocalHeld = fb.Local.Held
			_, out.Fallback.LocalFreeAfter = earliest(fb.Local)
		}
	}
	return out, nil
}

func instancesOf(fb *slot.FallbackInspection) int64 {
	if fb == nil {
		return 1
	}
	return fb.Instances
}

// earliest is in's earliest expiry as a time and as the time left.
func earliest(in *slot.Inspection) (time.Time, time.Duration) {
	if in.Held == 0 || in.Earliest == 0 {
		return time.Time{}, 0
	}
	return time.UnixMicro(in.Earliest), time.Duration(max(0, in.Earliest-in.Now)) * time.Microsecond
}
