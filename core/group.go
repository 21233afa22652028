package core

import (
	"context"
	"errors"
	"fmt"
)

// Request is one request of a group that Store.TakeGroup decides in one
// step: a cost on a key under one of the Store's Policies.
type Request struct {
	// Policy is the limits that decide the request; a Policy the Store
	// prepared.
	Policy Policy
	// Key and N are the request's key and cost, as Take takes them.
	Key string
	N   int64
	// Force charges N whatever the limits say, as Policy.Charge does,
	// instead of taking it.
	Force bool
	// Advisory marks a request whose denial does not undo an all-or-nothing
	// group: a limit in shadow mode, say, that is counted but never
	// enforced.
	Advisory bool
	// Decision is the request's answer, set by TakeGroup.
	Decision Decision
}

// ForeignPolicy returns the error Store.TakeGroup gives for a request whose
// Policy another Store prepared: it wraps ErrInvalidLimit.
func ForeignPolicy(i int, p Policy) error {
	return fmt.Errorf("%w: request %d: its policy (%T) was prepared by another store", ErrInvalidLimit, i, p)
}

// Undone marks d as the Decision of a request that an all-or-nothing
// group undid: not allowed, with a Retry of 0.
func Undone(d *Decision) { d.Allowed, d.Retry = false, 0 }

// Undo reports whether an all-or-nothing group whose Decisions are set
// must be undone: a request that is not Advisory was denied.
func Undo(reqs []Request) bool {
	for i := range reqs {
		if !reqs[i].Decision.Allowed && !reqs[i].Advisory {
			return true
		}
	}
	return false
}

// TakeEach is TakeGroup for stores that cannot decide a group in one step:
// it decides reqs one after another, through each Policy's Take (or, when
// Force, Charge), and gives back what was charged (Refund), the
// latest first, when the group is all or nothing and a request that is
// not Advisory was denied, or when a request fails. The Decisions are
// TakeGroup's, but other callers can see the charges until they are given
// back. Its errors are the first failing request's, joined with any
// refund's.
func TakeEach(ctx context.Context, reqs []Request, all bool) error {
	undo := false
	var err error
	n := 0
	for ; n < len(reqs); n++ {
		r := &reqs[n]
		if r.Force {
			r.Decision, err = r.Policy.Charge(ctx, r.Key, r.N)
		} else {
			r.Decision, err = r.Policy.Take(ctx, r.Key, r.N)
		}
		if err != nil {
			break
		}
		undo = undo || (!r.Decision.Allowed && !r.Advisory)
	}
	if err == nil && !(all && undo) {
		return nil
	}
	for i := n - 1; i >= 0; i-- {
		r := &reqs[i]
		if !r.Decision.Allowed || r.N == 0 {
			continue
		}
		d, rerr := r.Policy.Refund(ctx, r.Key, r.N)
		if rerr != nil {
			err = errors.Join(err, rerr)
			continue
		}
		r.Decision = d
		Undone(&r.Decision)
	}
	return err
}
