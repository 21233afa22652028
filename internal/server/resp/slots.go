package resp

import (
	"context"
	"time"

	"github.com/floodgate/floodgate"
	"github.com/floodgate/floodgate/internal/lib/arith"
	"github.com/floodgate/floodgate/internal/server/service"
)

// slot runs FG.ACQUIRE rule key, FG.RELEASE rule key permit and
// FG.EXTEND rule key permit. Replies:
//
//	FG.ACQUIRE: allowed (1 or 0), limit, held, retry_after_ms (0 when
//	            allowed), the permit (nil when denied)
//	FG.RELEASE: released (1, or 0 when not held), held
//	FG.EXTEND:  extended (1, or 0 when not held), held, the new expiry
//	            in Unix ms on the store's clock (0 when not held)
func (c *conn) slot(ctx context.Context, cmd string, args []string) {
	want := 4
	if cmd == "FG.ACQUIRE" {
		want = 3
	}
	if len(args) != want {
		c.writeError(errArgs(cmd))
		return
	}
	var d service.SlotDecision
	var err error
	switch cmd {
	case "FG.ACQUIRE":
		d, err = c.s.svc.Acquire(ctx, args[1], args[2])
	case "FG.RELEASE":
		d, err = c.s.svc.Release(ctx, args[1], args[2], args[3])
	default:
		d, err = c.s.svc.Extend(ctx, args[1], args[2], args[3])
	}
	if err != nil {
		if floodgate.IsInvalidInput(err) {
			c.writeError("ERR " + err.Error())
		} else {
			c.writeError(errText(err))
		}
		return
	}
	r := d.Result
	ok := int64(0)
	if r.Allowed {
		ok = 1
	}
	switch cmd {
	case "FG.ACQUIRE":
		c.writeArrayHeader(5)
		c.writeInt(ok)
		c.writeInt(r.Limit)
		c.writeInt(r.Held)
		c.writeInt(arith.RoundUp(r.RetryAfter, time.Millisecond))
		if r.Allowed {
			c.writeBulk(r.Permit.ID)
		} else {
			c.writeNil()
		}
	case "FG.RELEASE":
		c.writeInts(ok, r.Held)
	default:
		var exp int64
		if r.Allowed {
			exp = r.Permit.Expires.UnixMilli()
		}
		c.writeInts(ok, r.Held, exp)
	}
}
