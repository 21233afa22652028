package core

import (
	"context"
	"errors"
	"fmt"
)

// Request is one request of a group that a Grouper decides in one step: a
// cost on a key under one of the Store's Policies.
type Request struct {
	// Policy is the limits that decide the request; a Policy the Store
	// prepared.
	Policy Policy
	// Key and N are the request's key and cost, as Take takes them.
	Key string
	N   int64
	// Force charges N whatever the limits say, as Charger.Charge does,
	// instead of taking it.
	Force bool
	// Advisory marks a request whose denial does not undo an all-or-nothing
	// group: a limit in shadow mode, say, that is counted but never
	// enforced.
	Advisory bool
	// Decision is the request's answer, set by TakeGroup.
	Decision Decision
}

// Grouper is implemented by a Store that decides several requests, on any
// keys and any of its Policies, as one atomic step: the memory store under
// its locks, the Redis store in one script call where the keys share a
// server. floodgate.AllowGroup uses it, and decides one request after
// another on stores without it.
type Grouper interface {
	// TakeGroup decides reqs in order, each as its Policy's Take (or
	// Charge, when Force) would, and sets each one's Decision. Concurrent
	// requests see all of the group's charges or none: a request later in
	// the group sees what earlier ones on its key charged.
	//
	// With all set, the group is all or nothing: when a request that is not
	// Advisory is denied, what the others charged is given back (as Refund
	// does, at the same instant) before anyone else can see it. The
	// Decisions of the requests so undone are not Allowed, have a Retry of
	// 0 (their own limits admit them; a denial's Retry is never 0), and
	// report the state after the refund.
	//
	// Its errors are Take's, for the first request that has one; on an
	// error no Decision is to be used, and nothing is charged unless the
	// store failed part way. It keeps nothing of reqs once it returns, even
	// when ctx ends first: callers reuse them.
	TakeGroup(ctx context.Context, reqs []Request, all bool) error
}

// CheckGroup returns nil when every request of reqs has a valid key and
// cost, and otherwise the first one's error (CheckRequest's), saying which
// request it is. A Grouper calls it first. An empty group is valid: there
// is nothing to decide.
func CheckGroup(reqs []Request) error {
	for i := range reqs {
		if err := CheckRequest(reqs[i].Key, reqs[i].N); err != nil {
			if len(reqs) > 1 {
				return fmt.Errorf("request %d: %w", i, err)
			}
			return err
		}
	}
	return nil
}

// ForeignPolicy returns the error a Grouper gives for a request whose
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
// Force, Charger.Charge), and gives back what was charged (Refunder), the
// latest first, when the group is all or nothing and a request that is
// not Advisory was denied, or when a request fails. The Decisions are
// TakeGroup's, but other callers can see the charges until they are given
// back. Its errors are the first failing request's, joined with any
// refund's; a Policy that cannot charge or refund when it must gives an
// error wrapping errors.ErrUnsupported.
func TakeEach(ctx context.Context, reqs []Request, all bool) error {
	undo := false
	var err error
	n := 0
	for ; n < len(reqs); n++ {
		r := &reqs[n]
		if r.Force {
			c, ok := r.Policy.(Charger)
			if !ok {
				err = fmt.Errorf("request %d: %T cannot charge: %w", n, r.Policy, errors.ErrUnsupported)
				break
			}
			r.Decision, err = c.Charge(ctx, r.Key, r.N)
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
		rf, ok := r.Policy.(Refunder)
		if !ok {
			err = errors.Join(err, fmt.Errorf("request %d: %T cannot refund: %w", i, r.Policy, errors.ErrUnsupported))
			continue
		}
		d, rerr := rf.Refund(ctx, r.Key, r.N)
		if rerr != nil {
			err = errors.Join(err, rerr)
			continue
		}
		r.Decision = d
		Undone(&r.Decision)
	}
	return err
}
