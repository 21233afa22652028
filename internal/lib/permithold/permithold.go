// Package permithold keeps a concurrency permit while the request that
// acquired it runs: it extends the permit every interval, ends the
// request's context when the permit is lost, and releases the permit when
// the request is done. httplimit and grpclimit hold their permits with it.
package permithold

import (
	"context"
	"log/slog"
	"time"

	"github.com/floodgate/floodgate"
)

// Holder holds permits of one Concurrency. It is safe for concurrent use.
type Holder struct {
	c     *floodgate.Concurrency
	every time.Duration
	clock floodgate.Clock
	log   *slog.Logger
	lost  error
	pkg   string
}

// New returns a Holder of c's permits that extends each every interval
// (0: a third of c's lease, so that two extends can fail before the
// permit expires; negative: never) waiting on clock (nil: the system's).
// A request whose permit is lost ends with the cause lost. Failures are
// logged to log, prefixed by pkg ("httplimit").
func New(c *floodgate.Concurrency, every time.Duration, clock floodgate.Clock, log *slog.Logger, lost error, pkg string) *Holder {
	if every == 0 {
		every = c.Lease() / 3
	}
	if clock == nil {
		clock = floodgate.SystemClock()
	}
	return &Holder{c: c, every: every, clock: clock, log: log, lost: lost, pkg: pkg}
}

// Hold returns the context for the request that holds p on key, a child of ctx,
// and the function that ends the hold when the request returns: it stops
// the extending and releases p, even after ctx has ended (the client may
// be gone; the slot must still come back).
func (h *Holder) Hold(ctx context.Context, key string, p floodgate.Permit) (context.Context, func()) {
	cctx, cancel := context.WithCancelCause(ctx)
	done := make(chan struct{})
	if h.every > 0 {
		go h.extend(cctx, cancel, p, done)
	} else {
		close(done)
	}
	return cctx, func() {
		cancel(nil)
		<-done
		if _, err := h.c.Release(context.WithoutCancel(ctx), p); err != nil {
			h.log.Error(h.pkg+": releasing a concurrency permit failed; it frees itself at its lease's end",
				"key", key, "error", err.Error())
		}
	}
}

// extend renews p every interval until ctx ends; when p cannot be renewed
// it cancels ctx with the lost cause. A store failure is logged and tried
// again at the next tick, while the permit lives.
func (h *Holder) extend(ctx context.Context, cancel context.CancelCauseFunc, p floodgate.Permit, done chan<- struct{}) {
	defer close(done)
	for {
		if h.clock.Sleep(ctx, h.every) != nil || ctx.Err() != nil {
			return
		}
		res, err := h.c.Extend(ctx, p)
		switch {
		case ctx.Err() != nil:
			return
		case err != nil:
			h.log.Error(h.pkg+": extending a concurrency permit failed", "key", p.Key, "error", err.Error())
		case !res.Allowed:
			cancel(h.lost)
			return
		default:
			p = res.Permit
		}
	}
}
