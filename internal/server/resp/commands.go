package resp

// The commands: parsing their arguments and writing their replies.

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/floodgate/floodgate"
	"github.com/floodgate/floodgate/internal/lib/arith"
	"github.com/floodgate/floodgate/internal/server/config"
	"github.com/floodgate/floodgate/internal/server/service"
)

func errArgs(cmd string) string {
	return "ERR wrong number of arguments for '" + strings.ToLower(cmd) + "' command"
}

func parseInt(s string) (int64, bool) {
	i, err := strconv.ParseInt(s, 10, 64)
	return i, err == nil
}

// dispatch runs one command and reports whether to keep the connection.
func (c *conn) dispatch(args []string) bool {
	cmd := strings.ToUpper(args[0])
	switch cmd {
	case "QUIT":
		c.writeSimple("OK")
		return false
	case "AUTH":
		c.auth(args)
		return c.failures < c.s.o.MaxAuthFailures
	case "HELLO":
		c.hello(args)
		return c.failures < c.s.o.MaxAuthFailures
	}
	if !c.authed {
		c.writeError("NOAUTH Authentication required.")
		return true
	}
	ctx := c.ctx
	switch cmd {
	case "PING":
		switch len(args) {
		case 1:
			c.writeSimple("PONG")
		case 2:
			c.writeBulk(args[1])
		default:
			c.writeError(errArgs(cmd))
		}
	case "ECHO":
		if len(args) != 2 {
			c.writeError(errArgs(cmd))
			return true
		}
		c.writeBulk(args[1])
	case "SELECT":
		if len(args) != 2 {
			c.writeError(errArgs(cmd))
		} else if args[1] != "0" {
			c.writeError("ERR DB index is out of range")
		} else {
			c.writeSimple("OK")
		}
	case "COMMAND":
		if len(args) > 1 && strings.EqualFold(args[1], "COUNT") {
			c.writeInt(int64(len(commandNames)))
			return true
		}
		c.writeArrayHeader(0)
	case "CLIENT":
		c.client(args)
	case "CL.THROTTLE":
		c.throttle(ctx, args)
	case "FG.CHECK":
		c.check(ctx, args)
	case "FG.SETTLE":
		c.settle(ctx, args)
	case "FG.RESET":
		if len(args) != 3 {
			c.writeError(errArgs(cmd))
			return true
		}
		if err := c.s.svc.Reset(ctx, args[1], args[2]); err != nil {
			c.writeError(errText(err))
			return true
		}
		c.writeSimple("OK")
	case "FG.OVERRIDE":
		c.override(ctx, args)
	case "FG.EXPLAIN":
		c.explain(ctx, args)
	case "FG.ACQUIRE", "FG.RELEASE", "FG.EXTEND": // concurrency rules (slots.go)
		c.slot(ctx, cmd, args)
	case "FG.RULES":
		rules := c.s.svc.Config().Rules
		c.writeArrayHeader(len(rules))
		for _, r := range rules {
			c.writeBulk(r.Name)
		}
	default:
		var b strings.Builder
		for _, a := range args[1:min(len(args), 4)] {
			b.WriteString("'" + printable([]byte(a)) + "' ")
		}
		c.writeError(fmt.Sprintf("ERR unknown command '%s', with args beginning with: %s", printable([]byte(args[0])), b.String()))
	}
	return true
}

var commandNames = []string{"cl.throttle", "fg.check", "fg.settle", "fg.reset", "fg.override", "fg.explain", "fg.rules", "fg.acquire", "fg.release", "fg.extend", "ping", "echo", "hello", "auth", "quit", "select", "command", "client"}

func (c *conn) client(args []string) {
	if len(args) < 2 {
		c.writeError(errArgs("client"))
		return
	}
	switch strings.ToUpper(args[1]) {
	case "ID":
		c.writeInt(c.id)
	case "SETNAME", "SETINFO", "NO-EVICT", "NO-TOUCH":
		c.writeSimple("OK")
	case "GETNAME":
		c.writeBulk("")
	default:
		c.writeError("ERR unknown subcommand '" + printable([]byte(args[1])) + "'. Try CLIENT HELP.")
	}
}

func errText(err error) string {
	switch {
	case errors.Is(err, service.ErrUnknownRule), errors.Is(err, service.ErrBadRequest):
		return "ERR " + err.Error()
	case errors.Is(err, floodgate.ErrKey):
		return "ERR " + err.Error() // "floodgate: key failed: redis: ..."
	}
	return "ERR store failed: " + err.Error()
}

func (c *conn) throttle(ctx context.Context, args []string) {
	if len(args) != 5 && len(args) != 6 {
		c.writeError(errArgs(args[0]))
		return
	}
	var v [4]int64
	v[3] = 1
	for i, a := range args[2:] {
		n, ok := parseInt(a)
		if !ok {
			c.writeError("ERR value is not an integer or out of range")
			return
		}
		v[i] = n
	}
	res, err := c.s.svc.Throttle(ctx, args[1], v[0], v[1], v[2], v[3])
	if err != nil {
		c.writeError(errText(err))
		return
	}
	c.writeDecision(res.Allowed, res, time.Second)
}

// writeDecision writes redis-cell's five integers: limited, limit,
// remaining, retry_after (-1 when allowed or never) and reset_after, the
// times in unit, rounded up.
func (c *conn) writeDecision(allowed bool, res floodgate.Result, unit time.Duration) {
	limited, retry := int64(0), int64(-1)
	if !allowed {
		limited = 1
		retry = arith.RoundUp(res.RetryAfter, unit) // -1 for never
	}
	c.writeInts(limited, res.Quota, res.Remaining, retry, arith.RoundUp(res.ResetAfter, unit))
}

func (c *conn) check(ctx context.Context, args []string) {
	if len(args) != 3 && len(args) != 4 {
		c.writeError(errArgs(args[0]))
		return
	}
	cost := int64(1)
	if len(args) == 4 {
		n, ok := parseInt(args[3])
		if !ok {
			c.writeError("ERR value is not an integer or out of range")
			return
		}
		cost = n
	}
	d, err := c.s.svc.Check(ctx, args[1], args[2], cost)
	if err != nil {
		c.writeError(errText(err))
		return
	}
	c.writeDecision(d.Allowed, d.Result, time.Millisecond)
}

func (c *conn) settle(ctx context.Context, args []string) {
	if len(args) != 5 {
		c.writeError(errArgs(args[0]))
		return
	}
	charged, ok1 := parseInt(args[3])
	cost, ok2 := parseInt(args[4])
	if !ok1 || !ok2 {
		c.writeError("ERR value is not an integer or out of range")
		return
	}
	d, err := c.s.svc.Settle(ctx, args[1], args[2], charged, cost)
	if err != nil {
		c.writeError(errText(err))
		return
	}
	c.writeDecision(d.Allowed, d.Result, time.Millisecond)
}

// override serves the FG.OVERRIDE family:
//
//	FG.OVERRIDE SET <rule> <key> <override>   the override in JSON or YAML, as PUT /v1/overrides takes it; +OK
//	FG.OVERRIDE GET <rule> <key>              [ttl_ms, limit...] (each limit as floodgate describes it), or nil
//	FG.OVERRIDE DEL <rule> <key> [<strategy>] +OK
//	FG.OVERRIDE LIST [<rule>]                 [[rule, key, ttl_ms, limit...], ...]
//
// ttl_ms is the time left, rounded up; 0 for ever.
func (c *conn) override(ctx context.Context, args []string) {
	if len(args) < 2 {
		c.writeError(errArgs(args[0]))
		return
	}
	sub := strings.ToUpper(args[1])
	want := map[string][2]int{"SET": {5, 5}, "GET": {4, 4}, "DEL": {4, 5}, "LIST": {2, 3}}
	n, ok := want[sub]
	if !ok {
		c.writeError(fmt.Sprintf("ERR unknown subcommand '%s'. Try FG.OVERRIDE SET, GET, DEL or LIST.", printable([]byte(args[1]))))
		return
	}
	if len(args) < n[0] || len(args) > n[1] {
		c.writeError(errArgs(args[0] + "|" + strings.ToLower(sub)))
		return
	}
	svc := c.s.svc
	switch sub {
	case "SET":
		o, err := config.ParseOverride("override", []byte(args[4]))
		if err != nil {
			c.writeError("ERR " + strings.ReplaceAll(err.Error(), "\n", "; "))
			return
		}
		if err := svc.SetOverride(ctx, args[2], args[3], o); err != nil {
			c.writeError(errText(err))
			return
		}
		c.writeSimple("OK")
	case "GET":
		o, ok, err := svc.GetOverride(ctx, args[2], args[3])
		switch {
		case err != nil:
			c.writeError(errText(err))
		case !ok:
			c.writeNil()
		default:
			c.writeOverride(o, false)
		}
	case "DEL":
		st := floodgate.Additive
		if len(args) == 5 {
			var err error
			if st, err = floodgate.ParseStrategy(strings.ToLower(args[4])); err != nil {
				c.writeError("ERR strategy must be additive, as-is, proportional or reset")
				return
			}
		}
		if err := svc.DeleteOverride(ctx, args[2], args[3], st); err != nil {
			c.writeError(errText(err))
			return
		}
		c.writeSimple("OK")
	case "LIST":
		rule := ""
		if len(args) == 3 {
			rule = args[2]
		}
		list, _, err := svc.ListOverrides(ctx, rule)
		if err != nil {
			c.writeError(errText(err))
			return
		}
		c.writeArrayHeader(len(list))
		for _, o := range list {
			c.writeOverride(o, true)
		}
	}
}

// writeOverride writes [ttl_ms, limit...], or with named
// [rule, key, ttl_ms, limit...].
func (c *conn) writeOverride(o service.Override, named bool) {
	n := 1 + len(o.Limits)
	if named {
		n += 2
		c.writeArrayHeader(n)
		c.writeBulk(o.Rule)
		c.writeBulk(o.Key)
	} else {
		c.writeArrayHeader(n)
	}
	c.writeInt(arith.RoundUp(o.TTL, time.Millisecond))
	for _, l := range o.Limits {
		c.writeBulk(l.String())
	}
}
