package redisstore

import (
	"context"
	"crypto/sha1"
	_ "embed"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"

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

// scriptSet is the scripts and the function library that a Store runs:
// each is one chunk of prelude.lua, bucket.lua and decide.lua (and the
// library cross.lua), with an entry that calls bucketOne, bucketBatch,
// decideBatch or crossBatch with the call's keys and arguments (see
// protocol.go's Assembly). It is immutable.
type scriptSet struct {
	// The scripts, by entry, for a Redis without functions (see
	// library), and their SHA-1s: the Store runs each with EVALSHA, and
	// with EVAL (which loads it) when Redis answers NOSCRIPT.
	sources, hashes [entries]string
	// The library's function of each entry, its name boxed once as
	// FCALL's argument (see fcallCmd), and the function that does the
	// same with its keys as arguments (argKeysArgs), nil for none.
	fns, argKeysFns [entries]any
	// The function library, its name, and its function that takes a
	// Cluster master's parts (see cross.go), boxed as fns.
	libraryCode, libraryName string
	crossFn                  any
}

// entry names one of the scripts' entry points, each a script and a
// function of the library.
type entry uint8

const (
	entryBucket  entry = iota // bucketOne: the fast path's lone request
	entryBuckets              // bucketBatch: the fast path's batch
	entryDecide               // decideBatch: decide.lua's batch
	entrySlots                // slots.lua: concurrency limits' operations
	entries
)

// argKeysArgs returns the arguments of a call of the buckets or decide
// function with its keys as arguments (<library>_buckets_argkeys,
// _decide_argkeys): the number of keys, the keys, then args. A Cluster
// call whose keys span slots passes them so, with no keys declared, under
// the functions' flag allow-cross-slot-keys: Redis refuses declared keys
// of several slots (CROSSSLOT) before a script runs. It is the one kind
// of call whose keys are not declared.
func argKeysArgs(keys []string, args []any) []any {
	all := make([]any, 0, 1+len(keys)+len(args))
	all = append(all, len(keys))
	for _, k := range keys {
		all = append(all, k)
	}
	return append(all, args...)
}

// scripts is the scriptSet of every Store: the scripts as they are.
var scripts = newScriptSet(preludeSource, "")

// newScriptSet assembles the scripts and the library from prelude (which
// the tests give a checker of the keys the scripts name, see
// TestDeclaredKeys) with entry, Lua run at each call with the call's keys
// in keys, before its function ("" for nothing). The scripts take KEYS and
// ARGV before decide.lua's locals of the same names hide them. expandLua
// writes Go's constants in (see protocol.go).
func newScriptSet(prelude, entry string) *scriptSet {
	if entry != "" {
		entry += "\n"
	}
	head := "local scriptKeys, scriptArgv = KEYS, ARGV\n" + prelude + "init()\n"
	script := func(src, call string) string {
		return expandLua(head + src + "local keys = scriptKeys\n" + entry + "return " + call + "\n")
	}
	set := &scriptSet{sources: [entries]string{
		entryBucket:  script(bucketSource, "bucketOne(keys[1], keys[2], scriptArgv[1])"),
		entryBuckets: script(bucketSource, "bucketBatch(keys, scriptArgv)"),
		entryDecide:  script(decideSource, "decideBatch(keys, scriptArgv)"),
		// slots.lua needs nothing of the prelude, nor entry's checks.
		entrySlots: expandSlotLua(slotsSource) + "return slotsCall(KEYS, ARGV)\n",
	}}
	for e, src := range set.sources {
		set.hashes[e] = fmt.Sprintf("%x", sha1.Sum([]byte(src)))
	}
	set.libraryCode, set.libraryName = library(prelude, entry)
	name := set.libraryName
	set.fns = [entries]any{entryBucket: name + "_bucket", entryBuckets: name + "_buckets", entryDecide: name + "_decide", entrySlots: name + "_slots"}
	set.argKeysFns = [entries]any{entryBuckets: name + "_buckets_argkeys", entryDecide: name + "_decide_argkeys"}
	set.crossFn = name + "_cross"
	return set
}

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

// sendGroup runs calls whose keys share a slot in one script call of the
// engine that decides them (engineFor), and what that sends on. When an
// ACL refuses one of the call's keys, Redis refuses the whole call: then
// each call goes again alone, so that only the callers of the refused
// keys hear of it (a batch's worth of calls more, at most).
func (s *Store) sendGroup(ctx context.Context, calls []*call) {
	s.exec(ctx, s.engineFor(calls), calls)
	if len(calls) < 2 || !refusedKey(calls[0].err) {
		return
	}
	for _, c := range calls {
		c.out, c.err = nil, nil
		for _, m := range c.group {
			m.out, m.err = nil, nil
		}
		one := c.alone()
		s.exec(ctx, s.engineFor(one), one)
	}
}

// refusedKey reports whether err is an ACL's refusal of a script call
// for one of the keys it names (see keyAccessRefused).
func refusedKey(err error) bool {
	if !errors.Is(err, floodgate.ErrKey) {
		return false
	}
	msg := err.Error()
	i := strings.Index(msg, "NOPERM ")
	return i >= 0 && keyAccessRefused(msg[i:])
}

// decideEngine is decide.lua's batch (decideBatch): any requests on any
// limits. A call that decide.lua sends back for the keys of its key's
// override, which it does not declare (errUndeclared), goes again with
// them, in a call of those alone: at most maxDeclare times, each after an
// override that changed in between.
type decideEngine struct{}

func (decideEngine) entry() entry { return entryDecide }

func (e decideEngine) settle(ctx context.Context, s *Store, f frame) {
	send := f.calls
	for try := 1; ; try++ {
		var again []*call
		for _, c := range send {
			if c.err != errUndeclared {
				continue
			}
			if try == maxDeclare {
				c.err = fmt.Errorf("%w: redis: the override of a key changed %d times while it was decided", floodgate.ErrStore, maxDeclare)
				continue
			}
			c.out, c.err = nil, nil
			for _, m := range c.group {
				m.out, m.err = nil, nil
			}
			again = append(again, c)
		}
		if again == nil {
			break
		}
		send = s.trip(ctx, e, again).calls
	}
	for _, c := range f.calls {
		if c.err == nil {
			s.foreign.settle(c)
			for _, m := range c.group {
				s.foreign.settle(m)
			}
		}
	}
}

// maxDeclare is the most script calls that decideEngine makes for a
// call.
const maxDeclare = 3

// errUndeclared is decideEngine.decode's answer for a call that
// decide.lua sent back undecided, for the keys of an override that it
// did not declare (see undeclaredReply in decide.lua); overrideKeys now
// holds them.
var errUndeclared = errors.New("redisstore: the request's override has keys it did not declare")

// encode builds decide.lua's keys and arguments for calls whose keys
// share a slot.
func (decideEngine) encode(s *Store, calls []*call) frame {
	// Each request declares its limits' keys and its override key, and
	// after every request's, the keys of overrides' limits that requests
	// know they need (overrideKeys).
	var keys []string
	if len(calls) == 1 && calls[0].group == nil && s.overrideKeys.n.Load() == 0 {
		keys = calls[0].declared
	} else {
		nk := 0
		for _, c := range calls {
			nk += len(c.keys) + max(len(c.group), 1)
		}
		keys = make([]string, 0, nk)
		for _, c := range calls {
			if c.group == nil {
				keys = append(keys, c.declared...)
			}
			for _, m := range c.group {
				keys = append(keys, m.declared...)
			}
		}
		if s.overrideKeys.n.Load() > 0 {
			for _, c := range calls {
				if c.group == nil {
					keys = s.overrideKeys.appendTo(keys, c.okey)
				}
				for _, m := range c.group {
					keys = s.overrideKeys.appendTo(keys, m.okey)
				}
			}
		}
	}
	// The limits' specs go once each; requests name them by index.
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
	return frame{calls: calls, keys: keys, args: args, n: len(calls)}
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

// decode sets each call's result from decide.lua's reply.
func (decideEngine) decode(s *Store, f frame, cmd *redis.Cmd) {
	calls := f.calls
	res, err := cmd.Slice()
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
				if undeclared, ok := strings.CutPrefix(msg, "?"); ok {
					c.err = s.undeclared(c, undeclared)
				} else {
					c.err = s.wrap(c.ctx, errors.New(msg))
				}
				i++
				continue
			}
		}
		if c.group == nil {
			i, c.err = s.readOut(c, res, i)
			s.overrideKeys.settle(c)
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
			s.overrideKeys.settle(m)
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

// undeclared reads decide.lua's answer for c when a request of it (c, or
// a member of its group) needs the keys of its override, which the call
// did not declare: the override key and, after a newline, the override
// (see undeclaredReply in decide.lua). It records the keys that the
// request must declare (overrideKeys) and returns errUndeclared, or an
// error for an answer it cannot read.
func (s *Store) undeclared(c *call, msg string) error {
	okey, raw, ok := strings.Cut(msg, "\n")
	r := c
	if c.group != nil {
		r = nil
		for _, m := range c.group {
			if m.okey == okey {
				r = m
				break
			}
		}
	}
	if !ok || r == nil || r.okey != okey {
		return fmt.Errorf("%w: script asked for the keys of an override that no request of its call has: %q", floodgate.ErrStore, msg)
	}
	if err := s.declareOverride(r.p, okey, raw); err != nil {
		return err
	}
	return errUndeclared
}

// declareOverride records the keys of the override raw at okey that a
// request of p on its key declares besides p's own (see overrideKeys).
func (s *Store) declareOverride(p *policy, okey, raw string) error {
	limits, err := s.decoded.decode(raw)
	if err != nil {
		return err
	}
	s.overrideKeys.put(okey, p.extraKeys(okey, limits))
	return nil
}

// extraKeys returns the keys of limits, an override's, beside the
// override key okey, that p's keys are not: the Redis key of limit i is
// "<prefix>{key}:<i><kind letter>" for an override's limits as for a
// Policy's. nil when they are all p's.
func (p *policy) extraKeys(okey string, limits []core.Spec) []string {
	var extra []string
	base := strings.TrimSuffix(okey, "o")
	for i := range limits {
		suffix := strconv.Itoa(i) + string(suffixOf(limits[i].Kind))
		if !slices.Contains(p.suffixes, suffix) {
			extra = append(extra, base+suffix)
		}
	}
	return extra
}

// overrideKeys remembers, by a key's override key, the Redis keys of its
// override's limits that its Policy's keys are not: decide.lua decides a
// request on an overridden key with the override's limits, whose keys the
// request must declare. They are learnt from a reply that carries the
// override (errNotFast, errUndeclared), so that the key's next requests
// declare them at once; a request decided without an override drops its
// key's. It holds at most overrideKeysMax keys, and starts again empty
// when full.
type overrideKeys struct {
	n  atomic.Int32 // len(m), read without the lock
	mu sync.Mutex
	m  map[string][]string
}

const overrideKeysMax = 4096

// appendTo appends the keys recorded for the override key okey to keys.
func (o *overrideKeys) appendTo(keys []string, okey string) []string {
	if o.n.Load() == 0 {
		return keys
	}
	o.mu.Lock()
	keys = append(keys, o.m[okey]...)
	o.mu.Unlock()
	return keys
}

// put records extra, the keys that requests on the key whose override key
// is okey declare besides their Policy's; nil records that they need
// none.
func (o *overrideKeys) put(okey string, extra []string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if extra == nil {
		delete(o.m, okey)
	} else {
		if o.m == nil || len(o.m) >= overrideKeysMax {
			o.m = make(map[string][]string)
		}
		o.m[okey] = extra
	}
	o.n.Store(int32(len(o.m)))
}

// settle drops c's key's record when decide.lua decided c without an
// override.
func (o *overrideKeys) settle(c *call) {
	if c.limits == nil && o.n.Load() > 0 {
		o.put(c.okey, nil)
	}
}
