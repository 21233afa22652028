package floodgate

import (
	"context"
	"fmt"

	"github.com/floodgate/floodgate/core"

	"github.com/floodgate/floodgate/internal/lib/storekit"
)

// Request is one request of a group that AllowGroup decides: a cost on a
// key under a Limiter.
type Request struct {
	// Limiter applies its limits to the request.
	Limiter *Limiter
	// Key and N are the key and the cost, as AllowN takes them.
	Key string
	N   int64
	// Force charges N whatever the limits say, as Limiter.Charge does,
	// instead of taking it if they allow.
	Force bool
	// Advisory marks a request whose denial does not undo an
	// all-or-nothing group (a limit in shadow mode, say): it is decided
	// and reported, but never enforced on the others.
	Advisory bool
	// Result is the request's outcome, set by AllowGroup.
	Result Result
}

// AllowGroup decides several requests, on any keys and any Limiters, in
// order, and sets each one's Result: the requests of one API call that
// several limits of different keys apply to, for instance. A request sees
// what earlier requests of the group on its key charged.
//
// With all set, the group is all or nothing: if a request that is not
// Advisory is denied, none is charged; what the others took is given back
// (as Refund does). Their Results are then not Allowed, with a RetryAfter
// of 0 (their own limits admit them; a denial's RetryAfter is never 0),
// and report the state after the refund.
//
// When every Limiter is on one store (the memory store; the Redis store,
// in one script call when the keys share a server; the fallback store
// around it), the group is one atomic step:
// concurrent requests see all of its charges or none. Otherwise the
// requests are decided one after another and an undone group is refunded
// afterwards: the Results are the same, but others may see the charges for
// that moment. A group of any size is one step, so on Redis a large one
// holds the server for its whole script call, a little per request: keep
// groups to the requests of one call.
//
// Its errors are AllowN's, for the first request that has one (a nil
// Limiter is ErrInvalidLimit); on an error no Result is to be used.
func AllowGroup(ctx context.Context, reqs []Request, all bool) error {
	if len(reqs) == 0 {
		return nil
	}
	for i := range reqs {
		if reqs[i].Limiter == nil {
			return fmt.Errorf("%w: request %d has no Limiter", ErrInvalidLimit, i)
		}
	}
	if t := reqs[0].Limiter.tr; t != nil {
		return groupTraced(ctx, t, reqs, all)
	}
	return allowGroup(ctx, reqs, all)
}

// allowGroup is AllowGroup, untraced, on requests that all have a Limiter.
func allowGroup(ctx context.Context, reqs []Request, all bool) error {
	store := reqs[0].Limiter.store
	ok := true
	for i := range reqs[1:] {
		ok = ok && reqs[i+1].Limiter.store == store
	}
	// The store's TakeGroup, an interface method, makes the requests
	// escape: they come from the first Limiter's pool, and go back to it,
	// since TakeGroup keeps nothing of them once it returns.
	pool := &reqs[0].Limiter.groups
	gp := pool.Get(len(reqs))
	defer pool.Put(gp)
	group := *gp
	for i := range reqs {
		r := &reqs[i]
		group[i] = core.Request{Policy: r.Limiter.policy, Key: r.Key, N: r.N, Force: r.Force, Advisory: r.Advisory}
	}
	var err error
	if ok {
		err = store.TakeGroup(ctx, group, all)
	} else {
		err = storekit.TakeEach(ctx, group, all)
	}
	if err != nil {
		return err
	}
	for i := range reqs {
		reqs[i].Result = result(reqs[i].Limiter.specs, &group[i].Decision)
	}
	return nil
}
