package redisstore

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/floodgate/floodgate"
	"github.com/floodgate/floodgate/core"
	"github.com/redis/go-redis/v9"
)

// This file sends a batch of decisions as one call of decide.lua, which
// decides any number of requests on any limits.

var (
	//go:embed prelude.lua
	preludeSource string
	//go:embed decide.lua
	decideSource string
)

// decideScript is decide.lua as a script, for a Redis without functions
// (see library). It is immutable; go-redis runs it with EVALSHA and falls
// back to EVAL (which loads it) when Redis answers NOSCRIPT. The script's
// KEYS and ARGV are taken before decide.lua's locals of the same names
// hide them. expandLua writes Go's constants in (see protocol.go).
var decideScript = redis.NewScript(expandLua("local scriptKeys, scriptArgv = KEYS, ARGV\n" +
	preludeSource + "init()\n" + decideSource + "return decideBatch(scriptKeys, scriptArgv)\n"))

// scriptSpec is one limit's parameters as decide.lua reads them, in this
// order, into a table with fields of the same names (see readSpec there).
// The bucket's T and τ are worked out here, once, as core.Spec holds them.
type scriptSpec struct {
	kind       int64 // core.Kind: 1 bucket, 2 fixed, 3 sliding, 4 log
	quota      int64
	rate       int64
	period     int64 // µs
	tauQ, tauR int64 // τ = quota*period/rate = tauQ + tauR/rate µs
	tq, tr     int64 // T = period/rate = tq + tr/rate µs
	// A calendar window's windows, which Lua cannot work out without time
	// zones: [c0, c1) contains the client's now and [c1, c2) follows it;
	// 0 for every other limit.
	c0, c1, c2 int64
}

func newScriptSpec(sp *core.Spec) scriptSpec {
	return scriptSpec{kind: int64(sp.Kind), quota: sp.Quota, rate: sp.Rate, period: sp.Period,
		tauQ: sp.TauQ, tauR: sp.TauR, tq: sp.TQ, tr: sp.TR}
}

// appendArgs appends the spec as decide.lua reads it: one argument of 11
// big-endian doubles, which Redis parses with one call and decide.lua
// keeps parsed by its value, where 11 decimal strings cost it a strtod
// each at every call.
func (sp *scriptSpec) appendArgs(args []any) []any {
	var b [8 * 11]byte
	for i, v := range [...]int64{sp.kind, sp.quota, sp.rate, sp.period, sp.tauQ, sp.tauR, sp.tq, sp.tr, sp.c0, sp.c1, sp.c2} {
		putDouble(b[8*i:], v)
	}
	return append(args, string(b[:]))
}

// sendGroup runs calls whose keys share a slot in one script call, or,
// when they are all lone bucket decisions, through the fast path. When
// an ACL refuses one of the call's keys, Redis refuses the whole call:
// then each call goes again alone, so that only the callers of the
// refused keys hear of it (a batch's worth of calls more, at most).
func (s *Store) sendGroup(ctx context.Context, calls []*call) {
	s.sendCall(ctx, calls)
	if len(calls) < 2 || !refusedKey(calls[0].err) {
		return
	}
	for _, c := range calls {
		c.out, c.err = nil, nil
		for _, m := range c.group {
			m.out, m.err = nil, nil
		}
		s.sendCall(ctx, []*call{c})
	}
}

// refusedKey reports whether err is an ACL's refusal of a script call
// for one of the keys it names: "NOPERM this user has no permissions to
// access one of the keys" on Redis 7.0, "NOPERM No permissions to access
// a key" on Redis 7.2 and Valkey.
func refusedKey(err error) bool {
	if !errors.Is(err, floodgate.ErrKey) {
		return false
	}
	msg := err.Error()
	i := strings.Index(msg, "NOPERM ")
	return i >= 0 && strings.Contains(strings.ToLower(msg[i:]), "no permissions to access")
}

// sendCall is sendGroup's one script call (or the fast path's).
func (s *Store) sendCall(ctx context.Context, calls []*call) {
	if fast, groups := s.allFast(calls); fast && !s.noFastPath {
		// A batch of two or more goes out as one call of bucketBatch
		// rather than as a pipeline of one call each: one call costs
		// both sides less per decision (bench's redisbench, 8 goroutines).
		if len(calls) == 1 && !groups {
			s.sendBucket(ctx, calls[0])
		} else {
			s.sendBuckets(ctx, calls)
		}
		return
	}
	s.sendDecide(ctx, calls)
}

// sendDecide runs calls whose keys share a slot in one call of
// decide.lua.
func (s *Store) sendDecide(ctx context.Context, calls []*call) {
	keys, args := s.decideArgs(calls)
	s.counted(1, len(calls))
	res, err := s.runDecide(ctx, keys, args...).Slice()
	s.decideResult(calls, res, err)
	for _, c := range calls {
		if c.err == nil {
			s.foreign.settle(c)
			for _, m := range c.group {
				s.foreign.settle(m)
			}
		}
	}
}

// decideArgs builds decide.lua's keys and arguments for calls whose keys
// share a slot.
func (s *Store) decideArgs(calls []*call) ([]string, []any) {
	// The limits' specs go once each; requests name them by index.
	var keys []string
	if len(calls) == 1 {
		keys = calls[0].keys
	} else {
		nk := 0
		for _, c := range calls {
			nk += len(c.keys)
		}
		keys = make([]string, 0, nk)
		for _, c := range calls {
			keys = append(keys, c.keys...)
		}
	}
	index := make(map[scriptSpec]int, 4)
	var specs []*scriptSpec
	items, reqArgs := 0, 0
	addSpecs := func(c *call) {
		for i := range c.specs {
			if _, ok := index[c.specs[i]]; !ok {
				index[c.specs[i]] = len(specs) + 1
				specs = append(specs, &c.specs[i])
			}
		}
		reqArgs += 3 + len(c.specs)
	}
	for _, c := range calls {
		items++
		if c.group == nil {
			addSpecs(c)
			continue
		}
		reqArgs++
		for _, m := range c.group {
			addSpecs(m)
		}
	}
	args := make([]any, 0, 3+len(specs)+reqArgs)
	args = append(args, s.extraTTL, len(specs))
	for _, sp := range specs {
		args = sp.appendArgs(args)
	}
	args = append(args, items)
	for _, c := range calls {
		if c.group == nil {
			args = appendRequest(args, c, index)
			continue
		}
		head := "g"
		if c.all {
			head = "G"
		}
		args = append(args, head+strconv.Itoa(len(c.group)))
		for _, m := range c.group {
			args = appendRequest(args, m, index)
		}
	}
	return keys, args
}

// serverTime is now = -1, the server's TIME, boxed once.
var serverTime any = int64(-1)

// appendRequest appends c's request to decide.lua's arguments, naming its
// limits' specs by their index.
func appendRequest(args []any, c *call, index map[scriptSpec]int) []any {
	var n any = c.n
	switch {
	case c.op == opCharge:
		n = -c.n // decide.lua's sign for a forced charge
	case c.op == opRefund:
		n = "r" + strconv.FormatInt(c.n, 10) // and its form of a refund
	}
	var nk any = len(c.specs)
	if c.advisory {
		nk = "a" + strconv.Itoa(len(c.specs))
	}
	var now any = c.now
	if c.now == -1 {
		now = serverTime // boxed once
	}
	args = append(args, nk, n, now)
	for _, sp := range c.specs {
		args = append(args, index[sp])
	}
	return args
}

// decideResult sets each call's result from decide.lua's reply.
func (s *Store) decideResult(calls []*call, res []any, err error) {
	if err != nil {
		for _, c := range calls {
			c.err = s.wrap(c.ctx, err)
		}
		return
	}
	i := 0
	for _, c := range calls {
		if i < len(res) {
			if msg, ok := res[i].(string); ok && !strings.HasPrefix(msg, "=") {
				c.err = s.wrap(c.ctx, errors.New(msg))
				i++
				continue
			}
		}
		if c.group == nil {
			i, c.err = s.readOut(c, res, i)
			continue
		}
		// The members' results in one block (an overridden member's are
		// apart).
		n := 0
		for _, m := range c.group {
			n += 4 * len(m.specs)
		}
		block := make([]int64, n)
		for _, m := range c.group {
			m.out, block = block[:4*len(m.specs):4*len(m.specs)], block[4*len(m.specs):]
			if i, c.err = s.readOut(m, res, i); c.err != nil {
				break
			}
		}
	}
}

// readOut sets c.out from the 4 integers per limit of c that res holds at
// i, after the override that precedes them if the key has one, and
// returns the index after them.
func (s *Store) readOut(c *call, res []any, i int) (int, error) {
	c.limits = nil
	if i < len(res) {
		if msg, ok := res[i].(string); ok {
			raw, ok := strings.CutPrefix(msg, "=")
			if !ok {
				return i, fmt.Errorf("%w: script returned %q among a group's results", floodgate.ErrStore, msg)
			}
			limits, err := s.decoded.decode(raw)
			if err != nil {
				return i, err
			}
			c.limits = limits
			i++
		}
	}
	nk := c.count()
	if i+4*nk > len(res) {
		return i, fmt.Errorf("%w: script returned %d values, too few for its requests", floodgate.ErrStore, len(res))
	}
	if len(c.out) != 4*nk {
		c.out = make([]int64, 4*nk)
	}
	for j := range c.out {
		v, ok := res[i+j].(int64)
		if !ok {
			return i, fmt.Errorf("%w: script returned %T, not an integer", floodgate.ErrStore, res[i+j])
		}
		c.out[j] = v
	}
	return i + 4*nk, nil
}
