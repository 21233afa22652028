package resp

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
)

// explain serves FG.EXPLAIN <rule> <key> [JSON]: why a check of key under
// rule is decided as it is now, charging nothing (service.Explain); rule
// may be a concurrency rule, whose slots it looks at, acquiring nothing. It
// replies with the explanation's sentences, one bulk string each, or with
// JSON, the explanation as GET /v1/explain gives it, in one bulk string.
func (c *conn) explain(ctx context.Context, args []string) {
	if len(args) != 3 && len(args) != 4 {
		c.writeError(errArgs(args[0]))
		return
	}
	asJSON := len(args) == 4
	if asJSON && !strings.EqualFold(args[3], "JSON") {
		c.writeError("ERR syntax error: the only option of FG.EXPLAIN is JSON")
		return
	}
	e, err := c.s.svc.Explain(ctx, args[1], args[2])
	if err != nil {
		if errors.Is(err, errors.ErrUnsupported) {
			c.writeError("ERR " + err.Error())
			return
		}
		c.writeError(errText(err))
		return
	}
	if asJSON {
		b, err := json.Marshal(e)
		if err != nil {
			c.writeError("ERR " + err.Error())
			return
		}
		c.writeBulk(string(b))
		return
	}
	c.writeArrayHeader(len(e.Why))
	for _, line := range e.Why {
		c.writeBulk(line)
	}
}
