package storekit

import (
	"context"
	"errors"
	"fmt"

	"github.com/floodgate/floodgate/core"
)

// ForeignPolicy returns the error Store.TakeGroup gives for a request whose
// Policy another Store prepared: it wraps core.ErrInvalidLimit.
func ForeignPolicy(i int, p core.Policy) error {
	return fmt.Errorf("%w: request %d: its policy (%T) was prepared by another store", core.ErrInvalidLimit, i, p)
}

// Undone marks d as the Decision of a request that an all-or-nothing
// group undid: not allowed, with a Retry of 0.
func Undone(d *core.Decision) { d.Allowed, d.Retry = false, 0 }

// Undo reports whether an all-or-nothing group whose Decisions are set
// must be undone: a request that is not Advisory was denied.
func Undo(reqs []core.Request) bool {
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
func TakeEach(ctx context.Context, reqs []core.Request, all bool) error {
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
