package redisstore

import (
	"bytes"
	"context"
	"crypto/sha1"
	_ "embed"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/floodgate/floodgate"
	"github.com/floodgate/floodgate/core"
	"github.com/floodgate/floodgate/internal/lib/arith"
	"github.com/redis/go-redis/v9"
)

// This file is the fast path: one request on one bucket limit or one
// fixed window that is not a calendar window (the commonest decisions,
// and every Envoy descriptor's), decided by bucket.lua, which spares them
// decide.lua's general batch machinery. On Redis 7 and later it runs as a
// function of a library (FUNCTION LOAD, FCALL); elsewhere, or when an ACL
// refuses functions, as a script (EVALSHA).

//go:embed bucket.lua
var bucketSource string

// The function library holds the fast path and decide.lua as Redis
// functions (Redis 7 and later), called with FCALL. They decide exactly as
// the scripts do (see scriptSet), with the same code, but cost Redis
// less per call: a script's chunk runs at every call, binding its globals
// and building its helper closures each time, where a library's runs
// once, at load. For decide.lua, whose chunk builds some thirty helpers,
// that is most of the cost of a call that decides one request. The
// library and its functions are named by a hash of the library's code, so
// that floodgate versions sharing a Redis never call each other's code
// (the code with Go's constants written in, see protocol.go). entry is
// scriptSet's.
func library(prelude, entry string) (code, name string) {
	body := expandLua(prelude + bucketSource + decideSource + crossSource)
	slots := expandSlotLua(slotsSource)
	name = fmt.Sprintf("floodgate_%x", sha1.Sum([]byte(body+slots+entry)))[:26]
	// slots.lua's function comes first, where the library's locals (the
	// prelude's, set by init) do not hide the globals it reads, in a
	// block of its own, so that its locals do not count against the
	// chunk's limit of 200.
	code = "#!lua name=" + name + "\n" +
		"do\n" + slots + "redis.register_function('" + name + "_slots', slotsCall)\nend\n" +
		body +
		"redis.register_function('" + name + "_bucket', function(keys, args)\n" +
		"  if not call then init() end\n" + entry +
		"  return bucketOne(keys[1], keys[2], args[1])\n" +
		"end)\n" +
		"redis.register_function('" + name + "_buckets', function(keys, args)\n" +
		"  if not call then init() end\n" + entry +
		"  return bucketBatch(keys, args)\n" +
		"end)\n" +
		"redis.register_function('" + name + "_decide', function(keys, args)\n" +
		"  if not call then init() end\n" + entry +
		"  return decideBatch(keys, args)\n" +
		"end)\n" +
		// The same two with the keys as arguments (argKeysArgs), for a
		// Cluster call across slots, which Redis would refuse with them
		// declared: the one exception to declared keys (protocol.go).
		"redis.register_function{function_name = '" + name + "_buckets_argkeys', flags = {'allow-cross-slot-keys'}, callback = function(_, args)\n" +
		"  if not call then init() end\n" +
		"  local keys, rest = argKeys(args)\n" + entry +
		"  return bucketBatch(keys, rest)\n" +
		"end}\n" +
		"redis.register_function{function_name = '" + name + "_decide_argkeys', flags = {'allow-cross-slot-keys'}, callback = function(_, args)\n" +
		"  if not call then init() end\n" +
		"  local keys, rest = argKeys(args)\n" + entry +
		"  return decideBatch(keys, rest)\n" +
		"end}\n" +
		// The fast path's batch of every slot of a Cluster master, in
		// parts, each with its keys as arguments (crossBatch in
		// cross.lua, sendCross in cross.go): the same exception, one call
		// for many slots. entry checks each part's keys.
		"redis.register_function{function_name = '" + name + "_cross', flags = {'allow-cross-slot-keys'}, callback = function(_, args)\n" +
		"  if not call then init() end\n" +
		"  return crossBatch(args, " + crossCheck(entry) + ")\n" +
		"end}\n"
	return code, name
}

// allFast reports whether the fast path decides every call: each is one
// request on its Policy's lone bucket or fixed window (fast), on a key
// with no override of another kind that this process knows of, or a group
// of such requests, all or nothing or not (an Envoy request's
// descriptors, with STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT or without).
// groups says whether there is a group among them.
func (s *Store) allFast(calls []*call) (ok, groups bool) {
	for _, c := range calls {
		if c.group == nil {
			if !c.fast() || s.foreign.has(c.keys[0]) {
				return false, false
			}
			continue
		}
		for _, m := range c.group {
			if !m.fast() || s.foreign.has(m.keys[0]) {
				return false, false
			}
		}
		groups = true
	}
	return true, groups
}

// fast reports whether c is a request that the fast path decides: a take
// on a lone bucket or fixed window, a forced charge on a fixed window, or a
// refund on a bucket: a lease's give-back, which would otherwise send
// every request of the batch it joins to decide.lua.
func (c *call) fast() bool {
	f := c.p.fast
	return c.group == nil && f != nil && (c.op == opTake || (c.op == opCharge && f.window) || (c.op == opRefund && !f.window))
}

// foreignKeys remembers the keys (their first Redis key) whose override
// the fast path handed to decide.lua, so that their next decisions go to
// decide.lua at once: an override of another kind costs a process one
// extra round trip per key, not one per decision. A key leaves when
// decide.lua finds it without such an override. It holds at most
// foreignMax keys, and starts again empty when full.
type foreignKeys struct {
	n  atomic.Int32 // len(m), read without the lock by has
	mu sync.Mutex
	m  map[string]struct{}
}

const foreignMax = 4096

func (f *foreignKeys) has(key string) bool {
	if f.n.Load() == 0 {
		return false
	}
	f.mu.Lock()
	_, ok := f.m[key]
	f.mu.Unlock()
	return ok
}

func (f *foreignKeys) add(key string) {
	f.mu.Lock()
	if f.m == nil || len(f.m) >= foreignMax {
		f.m = make(map[string]struct{})
	}
	f.m[key] = struct{}{}
	f.n.Store(int32(len(f.m)))
	f.mu.Unlock()
}

// settle drops c's key when decide.lua found it with no override that the
// fast path could not decide.
func (f *foreignKeys) settle(c *call) {
	if f.n.Load() == 0 || !c.fast() {
		return
	}
	if len(c.limits) > 1 || (len(c.limits) == 1 && c.limits[0].Kind != c.p.specs[0].Kind) {
		return
	}
	f.mu.Lock()
	delete(f.m, c.keys[0])
	f.n.Store(int32(len(f.m)))
	f.mu.Unlock()
}

// bucketEngine is the fast path's lone request (bucketOne): one request
// on a lone bucket or fixed window, which declares its key and its
// override key. A request that the fast path does not decide goes on to
// decide.lua (handOn).
type bucketEngine struct{}

func (bucketEngine) entry() entry { return entryBucket }

func (bucketEngine) encode(_ *Store, calls []*call) frame {
	c := calls[0]
	c.abuf[0] = c.p.fast.boxed(c.now, c.n, c.op, false)
	return frame{calls: calls, keys: c.declared, args: c.abuf[:], n: 1}
}

// decode reads bucketOne's reply, one record (see bucketRecord), or its
// error.
func (bucketEngine) decode(s *Store, f frame, cmd *redis.Cmd) {
	c := f.calls[0]
	res, err := cmd.Text()
	if err != nil {
		c.out, c.err = nil, s.wrap(c.ctx, err)
		return
	}
	if c.out, res, c.err = s.bucketRecord(c, res); c.err == nil && res != "" {
		c.out, c.err = nil, fmt.Errorf("%w: script returned %d bytes after its reply", floodgate.ErrStore, len(res))
	}
}

func (bucketEngine) settle(ctx context.Context, s *Store, f frame) {
	s.handOn(ctx, f.calls)
}

// handOn sends to decide.lua, in one call, those of calls that the fast
// path answered with errNotFast, and remembers their keys (foreignKeys):
// a group's, all of its members' keys.
func (s *Store) handOn(ctx context.Context, calls []*call) {
	var slow []*call
	for _, c := range calls {
		if c.err != errNotFast {
			continue
		}
		if c.group == nil {
			s.foreign.add(c.keys[0])
		}
		for _, m := range c.group {
			s.foreign.add(m.keys[0])
		}
		c.err = nil
		slow = append(slow, c)
	}
	if slow != nil {
		s.exec(ctx, decideEngine{}, slow)
	}
}

// fastArgs is the fast path's argument (see bucket.lua): for a bucket ten
// big-endian doubles, of which all but now, n and n*T are the same for
// every decision on a policy, and are packed once, by Prepare; for a fixed
// window five, of which all but now and n are. In a batch, a request on a
// key that another request of the batch names too has one byte more (see
// bucketBatch).
type fastArgs struct {
	packed [81]byte // now and n (0 here), extra, then a bucket's quota, rate, period, tauQ, tauR, n*T or a window's quota, period; a last 0
	window bool     // a fixed window's
	// The arguments of the commonest requests, built once (see boxed):
	// they take 1, or for a window charge 1, on the server's clock, on a
	// key of their own and on a shared one.
	take1, charge1             any
	take1Shared, charge1Shared any
	// A bucket's, for n*T when n is not 1.
	quota  int64
	period int64
	rate   int64
	tq, tr int64
}

func newFastArgs(sp *core.Spec, extraTTL int64) *fastArgs {
	if sp.Kind == core.Fixed {
		f := &fastArgs{window: true}
		for i, v := range [...]int64{extraTTL, sp.Quota, sp.Period} {
			putDouble(f.packed[8*(2+i):], v)
		}
		f.take1, f.charge1 = f.arg(-1, 1, opTake, false), f.arg(-1, 1, opCharge, false)
		f.take1Shared, f.charge1Shared = f.arg(-1, 1, opTake, true), f.arg(-1, 1, opCharge, true)
		return f
	}
	f := &fastArgs{quota: sp.Quota, period: sp.Period, rate: sp.Rate, tq: sp.TQ, tr: sp.TR}
	for i, v := range [...]int64{extraTTL, sp.Quota, sp.Rate, sp.Period, sp.TauQ, sp.TauR} {
		putDouble(f.packed[8*(2+i):], v)
	}
	f.take1, f.take1Shared = f.arg(-1, 1, opTake, false), f.arg(-1, 1, opTake, true)
	return f
}

// boxed returns arg(now, n, o, shared) as a script argument. The
// commonest requests, which take (or charge) 1 on the server's clock, have
// theirs built once: a request's argument is otherwise a string and an
// interface value allocated for every request.
func (f *fastArgs) boxed(now, n int64, o op, shared bool) any {
	if now == -1 && n == 1 {
		switch {
		case o == opTake && shared:
			return f.take1Shared
		case o == opTake:
			return f.take1
		case o == opCharge && f.window && shared:
			return f.charge1Shared
		case o == opCharge && f.window:
			return f.charge1
		}
	}
	return f.arg(now, n, o, shared)
}

// arg returns the argument for a request of cost n at now (µs, or -1 for
// the server's TIME) that takes n, or for a fixed window charges it and
// for a bucket gives it back (o); shared says that another request of its
// batch names its key.
func (f *fastArgs) arg(now, n int64, o op, shared bool) string {
	buf := f.packed
	putDouble(buf[0:], now)
	more := 0 // the byte that says shared
	if shared {
		more = 1
	}
	if f.window {
		if o == opCharge {
			n = -n // bucket.lua's charge
		}
		putDouble(buf[8:], n)
		return string(buf[:windowArgLen+more])
	}
	iq, ir := f.tq, f.tr // n*T for the common n = 1
	if o == opRefund {
		// bucket.lua's refund is a negative cost, and it computes n*T
		// itself, of n at most the limit's quota, which an override's may
		// change. A refund of 0 goes as a peek (n*T 0), which answers
		// alike and writes nothing.
		n, iq, ir = -n, 0, 0
	} else if n != 1 && n <= f.quota {
		iq, ir = arith.MulDiv(n, f.period, f.rate)
	}
	putDouble(buf[8:], n)
	putDouble(buf[64:], iq)
	putDouble(buf[72:], ir)
	return string(buf[:bucketArgLen+more])
}

func putDouble(b []byte, v int64) {
	binary.BigEndian.PutUint64(b, math.Float64bits(float64(v)))
}

// bucketsEngine is the fast path's batch (bucketBatch in bucket.lua):
// each request costs Redis the fast path's two reads and one write,
// without decide.lua's general machinery, and the call's own cost is
// shared by all of them. A group goes in the same call, its requests
// after its mark (see groupArgs), and is decided whole or handed on
// whole. The requests that the fast path does not decide go on to
// decide.lua (handOn).
type bucketsEngine struct{}

func (bucketsEngine) entry() entry { return entryBuckets }

func (e bucketsEngine) decode(s *Store, f frame, cmd *redis.Cmd) {
	res, err := cmd.Text()
	e.read(s, f, res, err)
}

func (bucketsEngine) settle(ctx context.Context, s *Store, f frame) {
	s.handOn(ctx, f.calls)
}

// encode returns calls in the order bucketBatch reads them, its keys
// (each request's key, then each one's override key) and arguments for
// them, and how many requests they hold (a group's members each).
func (bucketsEngine) encode(_ *Store, calls []*call) frame {
	n := 0
	for _, c := range calls {
		n += max(len(c.group), 1)
	}
	keys := appendKeys(make([]string, 0, 2*n), calls)
	var shared []bool // for each of keys: whether another request names it too
	keyMap := ""      // the argument that maps requests to their keys' places, if any
	dup := repeats(keys)
	if dup != nil || len(keys) > len(calls) { // repeats, or a group of several
		calls, shared = lonesFirst(calls, dup, n)
		keys = appendKeys(keys[:0], calls)
	}
	if dup != nil {
		keys, keyMap = distinctKeys(keys, calls)
	}
	if keyMap == "" {
		keys = appendOverrideKeys(keys, calls)
	}
	args := make([]any, 0, len(calls)+n+1)
	i := 0 // keys[i] is c's first
	for _, c := range calls {
		if c.group == nil {
			args = append(args, c.p.fast.boxed(c.now, c.n, c.op, shared != nil && shared[i]))
			i++
			continue
		}
		args = groupArgs(args, c)
		for _, m := range c.group {
			args = append(args, m.p.fast.boxed(m.now, m.n, m.op, shared != nil && shared[i]))
			i++
		}
	}
	if keyMap != "" {
		args = append(args, keyMap)
	} else {
		args = argRuns(args)
	}
	return frame{calls: calls, keys: keys, args: args, n: n}
}

// argRuns returns bucketBatch's arguments args with each run of equal
// ones sent once, and the argument map that says how many times each
// stands (argMapMark, then 2 big-endian bytes per run), last; or args
// as they are when the runs are more than half of them, or longer than 2
// bytes count. Redis parses each argument of a call, and Lua takes each
// into ARGV, at a cost per argument that the batch's requests of one
// Policy and cost (the same bytes, see fastArgs.boxed) would pay again and
// again; Lua pays a call of byte per run to expand them (expandArgs in
// bucket.lua). It reuses args.
func argRuns(args []any) []any {
	if len(args) < 2 || len(args) > keyMapMax {
		return args
	}
	runs := 0
	for i := range args {
		if i == 0 || args[i] != args[i-1] {
			runs++
		}
	}
	if 2*runs > len(args) {
		return args
	}
	m := make([]byte, 1, 1+2*runs)
	m[0] = argMapMark
	r := 0 // args[:r] are the runs' arguments so far
	for i := 0; i < len(args); {
		j := i + 1
		for j < len(args) && args[j] == args[i] {
			j++
		}
		args[r] = args[i]
		r++
		m = append(m, byte((j-i)>>8), byte(j-i))
		i = j
	}
	return append(args[:r], string(m))
}

// distinctKeys returns bucketBatch's keys for requests on keys (one each,
// in the order of calls, see appendKeys) some of which repeat: each
// distinct key once, in the order of their first requests, then their
// override keys in the same order; and the argument, last of the call's,
// that maps the requests to their keys: keyMapMark, the number of
// requests, then per run of consecutive requests on one key the key's
// place among the distinct keys (from 1) and the run's length, each 2
// big-endian bytes. Redis parses, and checks against ACLs and the
// Cluster's slots, every key a call declares: a batch of many requests on
// one hot key declares its two keys once. Lua pays for each run, so when
// a call would declare fewer key pairs less than it has runs (repeats
// scattered among many keys), or counts more than 2 bytes hold, it
// returns keys and "": each request's key and override key, as without
// repeats.
func distinctKeys(keys []string, calls []*call) ([]string, string) {
	n := len(keys)
	if n > keyMapMax {
		return keys, ""
	}
	place := make(map[string]int, n)
	distinct := make([]string, 0, n)
	m := make([]byte, 3, 3+4*n)
	m[0], m[1], m[2] = keyMapMark, byte(n>>8), byte(n)
	runs, last, run := 0, 0, 0 // runs so far, the last one's place and length
	for i, k := range keys {
		j, ok := place[k]
		if !ok {
			distinct = append(distinct, k)
			j = len(distinct)
			place[k] = j
		}
		if i > 0 && j == last {
			run++
			continue
		}
		if i > 0 {
			m = append(m, byte(last>>8), byte(last), byte(run>>8), byte(run))
		}
		runs, last, run = runs+1, j, 1
	}
	m = append(m, byte(last>>8), byte(last), byte(run>>8), byte(run))
	if n-len(distinct) < runs {
		return keys, ""
	}
	d := len(distinct)
	for _, c := range calls {
		reqs := c.group
		if reqs == nil {
			reqs = []*call{c}
		}
		for _, r := range reqs {
			if place[r.keys[0]] == len(distinct)-d+1 { // its key's first request
				distinct = append(distinct, r.okey)
			}
		}
	}
	return distinct, string(m)
}

// groupArgs appends the mark of the group c to bucketBatch's arguments:
// "g<count>" for a group that is not all or nothing, "G<count>" for one
// that is, and "H<count>" and its advisory requests' flags for one that
// is with advisory requests (see protocol.go).
func groupArgs(args []any, c *call) []any {
	count := strconv.Itoa(len(c.group))
	if !c.all {
		return append(args, groupMark+count)
	}
	var flags []byte
	for i, m := range c.group {
		if m.advisory && flags == nil {
			flags = bytes.Repeat([]byte{'0'}, len(c.group))
		}
		if m.advisory {
			flags[i] = '1'
		}
	}
	if flags == nil {
		return append(args, groupAllMark+count)
	}
	return append(args, groupFlaggedMark+count, string(flags))
}

// read sets the results of f's calls from bucketBatch's reply res or its
// error err: the decoding of a reply that a Cluster's call across slots
// (cross.go) carries a part of.
func (bucketsEngine) read(s *Store, f frame, res string, err error) {
	calls, n := f.calls, f.n
	read := func(c *call) {
		switch {
		case err != nil:
			c.out, c.err = nil, s.wrap(c.ctx, err)
		case res == "":
			c.out, c.err = nil, fmt.Errorf("%w: script returned too few replies for %d requests", floodgate.ErrStore, n)
		default:
			c.out, res, c.err = s.bucketRecord(c, res)
		}
	}
	for _, c := range calls {
		if c.group == nil {
			read(c)
			continue
		}
		// Each request of a group that the script did not decide has the
		// record that says why: the group's error is the first.
		c.err = nil
		for _, m := range c.group {
			if read(m); m.err != nil && c.err == nil {
				c.err = m.err
			}
		}
		if c.err != nil {
			for _, m := range c.group {
				m.out, m.err = nil, nil
			}
		}
	}
	if err == nil && res != "" {
		// Never seen: the calls above already have their replies.
		for _, c := range calls {
			c.out, c.err = nil, fmt.Errorf("%w: script returned more replies than the %d requests", floodgate.ErrStore, n)
			for _, m := range c.group {
				m.out = nil
			}
		}
	}
}

// appendKeys appends the key of each request of calls, a group's members'
// in turn, as bucketBatch reads them.
func appendKeys(keys []string, calls []*call) []string {
	for _, c := range calls {
		if c.group == nil {
			keys = append(keys, c.keys[0])
			continue
		}
		for _, m := range c.group {
			keys = append(keys, m.keys[0])
		}
	}
	return keys
}

// appendOverrideKeys appends the override key of each request of calls,
// as appendKeys appends their keys.
func appendOverrideKeys(keys []string, calls []*call) []string {
	for _, c := range calls {
		if c.group == nil {
			keys = append(keys, c.okey)
			continue
		}
		for _, m := range c.group {
			keys = append(keys, m.okey)
		}
	}
	return keys
}

// repeats reports for each of keys whether keys holds it more than once,
// or returns nil when none is: in a batch over many keys, the commonest.
func repeats(keys []string) []bool {
	var r []bool
	mark := func(i, j int) {
		if r == nil {
			r = make([]bool, len(keys))
		}
		r[i], r[j] = true, true
	}
	if len(keys) <= 16 {
		for i := range keys {
			for j := i + 1; j < len(keys); j++ {
				if keys[i] == keys[j] {
					mark(i, j)
				}
			}
		}
		return r
	}
	first := make(map[string]int, len(keys))
	for i, k := range keys {
		if j, ok := first[k]; ok {
			mark(i, j)
			continue
		}
		first[k] = i
	}
	return r
}

// lonesFirst returns calls in the order bucketBatch takes them best: first
// the lone requests on keys that no other request of calls names, whose
// states it reads with one MGET, then the others (requests on shared keys,
// groups), each part in the order of calls; and for each key of the
// requests in that order (a group's members' in turn, see appendKeys),
// whether another request names it too. dup is repeats' answer on calls'
// n keys, or nil for none. A request's place among requests on other keys
// changes nothing: only the order of the requests on one key does.
func lonesFirst(calls []*call, dup []bool, n int) (ordered []*call, shared []bool) {
	ordered, shared = make([]*call, 0, len(calls)), make([]bool, 0, n)
	for _, own := range [...]bool{true, false} {
		i := 0 // calls' first key in dup
		for _, c := range calls {
			k := max(len(c.group), 1)
			if (c.group == nil && (dup == nil || !dup[i])) == own {
				ordered = append(ordered, c)
				for j := range k {
					shared = append(shared, dup != nil && dup[i+j])
				}
			}
			i += k
		}
	}
	return ordered, shared
}

// bucketRecord reads the first record of the fast path's reply b (see
// bucket.lua): c's 4 values allowed, remaining, retry and reset, and the
// key's override after them if it has one (set in c.limits). It returns
// the rest of b, and errNotFast for a key whose override decide.lua must
// decide.
func (s *Store) bucketRecord(c *call, b string) (out []int64, rest string, err error) {
	c.limits = nil
	if b == "" {
		return nil, "", fmt.Errorf("%w: script returned an empty reply", floodgate.ErrStore)
	}
	kind, b := b[0], b[1:]
	switch kind {
	case recordDecision, recordOverride:
		if len(b) < 32 {
			break
		}
		out = c.obuf[:]
		for i := range out {
			out[i] = int64(math.Float64frombits(bigEndian64(b[8*i:])))
		}
		if b = b[32:]; kind == recordDecision {
			return out, b, nil
		}
		raw, rest, ok := lengthPrefixed(b)
		if !ok {
			break
		}
		if c.limits, err = s.decoded.decode(raw); err != nil {
			return nil, rest, err
		}
		return out, rest, nil
	case recordElsewhere:
		if raw, rest, ok := lengthPrefixed(b); ok {
			// decide.lua's call declares the keys of the override's
			// limits.
			if err := s.declareOverride(c.p, c.okey, raw); err != nil {
				return nil, rest, err
			}
			return nil, rest, errNotFast
		}
	case recordError:
		if msg, rest, ok := lengthPrefixed(b); ok {
			return nil, rest, s.wrap(c.ctx, errors.New(msg))
		}
	}
	return nil, "", fmt.Errorf("%w: script returned a reply floodgate cannot read", floodgate.ErrStore)
}

// lengthPrefixed reads a string of b that its length (4 bytes, big-endian)
// precedes, and returns it and the rest of b.
func lengthPrefixed(b string) (s, rest string, ok bool) {
	if len(b) < 4 {
		return "", "", false
	}
	n := uint64(b[0])<<24 | uint64(b[1])<<16 | uint64(b[2])<<8 | uint64(b[3])
	if n > uint64(len(b)-4) {
		return "", "", false
	}
	return b[4 : 4+n], b[4+n:], true
}

// bigEndian64 reads the first 8 bytes of b, big-endian.
func bigEndian64(b string) uint64 {
	_ = b[7]
	return uint64(b[0])<<56 | uint64(b[1])<<48 | uint64(b[2])<<40 | uint64(b[3])<<32 |
		uint64(b[4])<<24 | uint64(b[5])<<16 | uint64(b[6])<<8 | uint64(b[7])
}

// errNotFast is bucketRecord's answer for a key whose override the fast
// path does not decide.
var errNotFast = errors.New("redisstore: the key's override is for decide.lua")

// run calls entry e's function of the library while Redis takes
// functions, and runs its script, the function's equal, otherwise. The
// call is sent at most once (see onceCmd) unless Redis did not run it:
//   - a call that a Cluster refuses with TRYAGAIN goes again until it
//     runs, the caller's context ends, or tryAgainFor has passed: while a
//     slot migrates, Redis refuses every call that declares keys of it
//     some of which are missing (as an absent override key usually is),
//     until the slot has moved, which on a loaded host takes longer than
//     go-redis's few retries;
//   - a call refused otherwise before it ran (see sendAgain), or that
//     never reached Redis (see unsent), goes again as often as the
//     client's retry options say, as go-redis sends a command again.
//
// A call whose fate is unknown (a connection broken or timed out after
// the send) is not sent again: it may have run, and a second run would
// charge its requests twice, or find its own acquire's permit held.
func (s *Store) run(ctx context.Context, e entry, keys []string, args []any) *redis.Cmd {
	cmd := s.runOnce(ctx, e, keys, args)
	if cmd.Err() == nil {
		return cmd
	}
	return s.untilRun(ctx, cmd, func() *redis.Cmd { return s.runOnce(ctx, e, keys, args) })
}

// untilRun calls again while cmd, call's last answer, says that the call
// did not run, as run does, and returns the last answer.
func (s *Store) untilRun(ctx context.Context, cmd *redis.Cmd, call func() *redis.Cmd) *redis.Cmd {
	deadline := time.Now().Add(tryAgainFor)
	moveWait, tries := tryAgainWait, 0
	for {
		var wait time.Duration
		switch err := cmd.Err(); {
		case tryAgain(err):
			if !time.Now().Before(deadline) {
				return cmd
			}
			wait, moveWait = moveWait, min(2*moveWait, tryAgainMaxWait)
		case resendable(err) && tries < s.resends.tries:
			tries++
			wait = s.resends.wait(tries)
		default:
			return cmd
		}
		if wait > 0 {
			t := time.NewTimer(wait)
			select {
			case <-ctx.Done():
				t.Stop()
				return cmd
			case <-t.C:
			}
		}
		cmd = call()
	}
}

// The waits between the calls that run sends again after TRYAGAIN: from
// tryAgainWait, doubling to tryAgainMaxWait, for tryAgainFor at most.
const (
	tryAgainWait    = 2 * time.Millisecond
	tryAgainMaxWait = 100 * time.Millisecond
	tryAgainFor     = 10 * time.Second
)

// resends is how often run sends again a call that did not run, other
// than for a slot's move, and how long it waits before each time: the
// client's own retry options (MaxRetries, or a Cluster's MaxRedirects,
// and its retry backoff), with which go-redis sends again any command
// that it may.
type resends struct {
	tries            int
	minWait, maxWait time.Duration
}

// resendsOf returns client's resends; go-redis's defaults for a client
// whose options it cannot read.
func resendsOf(client redis.UniversalClient) resends {
	switch c := client.(type) {
	case *redis.Client:
		o := c.Options()
		return resends{o.MaxRetries, o.MinRetryBackoff, o.MaxRetryBackoff}
	case *redis.ClusterClient:
		o := c.Options()
		return resends{o.MaxRedirects, o.MinRetryBackoff, o.MaxRetryBackoff}
	case *redis.Ring:
		o := c.Options()
		return resends{o.MaxRetries, o.MinRetryBackoff, o.MaxRetryBackoff}
	}
	return resends{3, 10 * time.Millisecond, time.Second}
}

// wait returns the wait before the try-th time a call goes again (from
// 1), as go-redis's backoff draws it: minWait plus a random part of
// minWait doubled try times, maxWait at most; 0 without a minWait. The
// random part keeps the callers refused together from calling again in
// step.
func (r resends) wait(try int) time.Duration {
	if r.minWait <= 0 {
		return 0
	}
	spread := r.minWait
	for i := 0; i < try && spread <= r.maxWait/2; i++ {
		spread *= 2
	}
	most := max(r.maxWait, r.minWait)
	if extra := rand.N(spread); extra < most-r.minWait {
		return r.minWait + extra
	}
	return most
}

// tryAgain reports whether err is a Cluster's TRYAGAIN: a call not run,
// because some of its keys are in a slot that is moving.
func tryAgain(err error) bool {
	return isRedisError(err) && strings.HasPrefix(err.Error(), "TRYAGAIN ")
}

// unsent reports whether err, a lone command's, says that the command
// never reached Redis whole: no connection could be made (a refused or
// timed-out dial), none was free in the pool in time, or its write
// failed, and Redis runs no command it has not read to its end. (A
// command in a Cluster pipeline may keep such an error from an earlier
// try after a later one sent it, and a pipeline's write may fail after
// its first commands went whole.)
func unsent(err error) bool {
	if err == nil {
		return false
	}
	var op *net.OpError
	return errors.As(err, &op) && (op.Op == "dial" || op.Op == "write") || errors.Is(err, redis.ErrPoolTimeout)
}

// runOnce is run's one call (and the library's loading).
func (s *Store) runOnce(ctx context.Context, e entry, keys []string, args []any) *redis.Cmd {
	if s.noFunctions.Load() {
		return s.evalScript(ctx, e, keys, args)
	}
	fn, fkeys, fargs := s.scripts.fns[e], keys, args
	if afn := s.scripts.argKeysFns[e]; s.argKeys && afn != nil {
		fn, fkeys, fargs = afn, nil, argKeysArgs(keys, args)
	}
	cmd := s.fcall(ctx, fn, fkeys, fargs)
	if functionMissing(cmd.Err()) {
		// Never loaded here, flushed, or a failover to a server without
		// it: load it, then call again.
		if err := s.loadLibrary(ctx); err != nil {
			if !isRedisError(err) {
				// A failure to reach a server: on a Cluster, perhaps
				// another master than this call's, which answered. This
				// call uses a script, and a later one loads the library.
				return s.evalScript(ctx, e, keys, args)
			}
			if !notRun(err) {
				s.noFunctions.Store(true) // refused: use scripts
			}
			// Refused for the moment (READONLY from a master that a
			// failover demoted, LOADING): this call uses a script, and a
			// later one loads the library again.
			return s.evalScript(ctx, e, keys, args)
		}
		cmd = s.fcall(ctx, fn, fkeys, fargs)
	}
	err := cmd.Err()
	switch {
	case err == nil:
		return cmd
	case functionMissing(err):
		// Still not found after loading: this call uses a script.
	case functionsRefused(err):
		s.noFunctions.Store(true) // Redis 6, or an ACL without FCALL
	default:
		return cmd // a failure to reach Redis, or the function's own error
	}
	return s.evalScript(ctx, e, keys, args)
}

// fcall calls the library's function fn (its name, boxed once: see
// scriptSet) on keys with args.
func (s *Store) fcall(ctx context.Context, fn any, keys []string, args []any) *redis.Cmd {
	cmd := fcallCmd(ctx, fn, keys, args)
	_ = s.client.Process(ctx, onceCmd{cmd}) // the error is cmd's
	return cmd
}

// evalScript runs entry e's script with EVALSHA, and with EVAL (which
// loads it) when Redis answers NOSCRIPT, as go-redis's Script.Run does,
// each sent once (see onceCmd).
func (s *Store) evalScript(ctx context.Context, e entry, keys []string, args []any) *redis.Cmd {
	cmd := evalshaCmd(ctx, s.scripts.hashes[e], keys, args)
	_ = s.client.Process(ctx, onceCmd{cmd})
	if redis.HasErrorPrefix(cmd.Err(), "NOSCRIPT") {
		cmd = scriptCmd(ctx, "eval", s.scripts.sources[e], keys, args)
		_ = s.client.Process(ctx, onceCmd{cmd})
	}
	return cmd
}

// fcallCmd returns the command FCALL fn on keys with args, as go-redis's
// FCall builds it (the same arguments, the same first key for a
// Cluster's routing), in one allocation of its arguments: FCall boxes
// the function's name and copies its variadic arguments at every call.
func fcallCmd(ctx context.Context, fn any, keys []string, args []any) *redis.Cmd {
	return scriptCmd(ctx, "fcall", fn, keys, args)
}

// evalshaCmd returns the command EVALSHA sha on keys with args, as
// fcallCmd does FCALL's.
func evalshaCmd(ctx context.Context, sha string, keys []string, args []any) *redis.Cmd {
	return scriptCmd(ctx, "evalsha", sha, keys, args)
}

// scriptCmd returns the command verb (FCALL or EVALSHA) of script on
// keys with args.
func scriptCmd(ctx context.Context, verb string, script any, keys []string, args []any) *redis.Cmd {
	all := make([]any, 3+len(keys), 3+len(keys)+len(args))
	all[0], all[1], all[2] = verb, script, len(keys)
	for i, k := range keys {
		all[3+i] = k
	}
	cmd := redis.NewCmd(ctx, append(all, args...)...)
	if len(keys) > 0 {
		cmd.SetFirstKeyPos(3)
	}
	return cmd
}

// onceCmd is a script call, which go-redis must not send again: it may
// have run. go-redis sends a command again after a broken connection or
// a read timeout, when the command may have run, and in a Cluster
// pipeline sends all of a master's commands again when the first one's
// error is one it retries (TRYAGAIN while a slot migrates, CLUSTERDOWN),
// those that ran too: a second run charges the call's requests twice,
// and finds its acquires' permits held already. The store sends again
// only the calls that did not run (see run and sendAgain); go-redis
// still follows a MOVED or ASK answer, which a call gets before it runs.
type onceCmd struct{ *redis.Cmd }

// NoRetry implements redis.Cmder: the command is never sent again.
func (onceCmd) NoRetry() bool { return true }

// sendAgain reports whether err, a onceCmd's after its pipeline, says
// that Redis refused the call before it ran, so that it may go again:
// notRun's errors but MOVED and ASK. go-redis followed those already,
// and does not clear a command's error before it sends it again, so
// that a call whose send after a MOVED failed on its connection keeps
// the MOVED, and may have run.
func sendAgain(err error) bool {
	if !notRun(err) {
		return false
	}
	msg := err.Error()
	return !strings.HasPrefix(msg, "MOVED ") && !strings.HasPrefix(msg, "ASK ")
}

// resendable reports whether err says that a call did not run and may go
// again: sendAgain's refusals, and unsent's failures to reach Redis.
func resendable(err error) bool {
	return sendAgain(err) || unsent(err)
}

// functionMissing reports whether err is Redis saying the library is not
// loaded: the call was not run.
func functionMissing(err error) bool {
	return isRedisError(err) && strings.HasPrefix(err.Error(), "ERR Function not found")
}

// functionsRefused reports whether err is Redis refusing FCALL: a server
// before Redis 7, or an ACL that does not allow it. An ACL's refusal of
// one of the call's keys ("no permissions to access", see refusedKey) is
// not: it is that key's failure, and the script would meet it too.
func functionsRefused(err error) bool {
	if !isRedisError(err) {
		return false
	}
	msg := err.Error()
	return strings.HasPrefix(msg, "ERR unknown command") || strings.HasPrefix(msg, "NOPERM") && !keyAccessRefused(msg)
}

// keyAccessRefused reports whether msg, Redis's NOPERM or an error that
// quotes it, refuses access to a key rather than a command: "no
// permissions to access one of the keys" on Redis 7.0, "No permissions
// to access a key" on Redis 7.2 and Valkey.
func keyAccessRefused(msg string) bool {
	return strings.Contains(strings.ToLower(msg), "no permissions to access")
}

func isRedisError(err error) bool {
	if err == nil {
		return false // before rerr, which errors.As moves to the heap
	}
	var rerr redis.Error
	return errors.As(err, &rerr)
}

// loadLibrary loads the function library on the server, or on every
// master of a cluster (replicas get it from their master).
func (s *Store) loadLibrary(ctx context.Context) error {
	if cc, ok := s.client.(*redis.ClusterClient); ok {
		return cc.ForEachMaster(ctx, func(ctx context.Context, c *redis.Client) error {
			return c.FunctionLoadReplace(ctx, s.scripts.libraryCode).Err()
		})
	}
	return s.client.FunctionLoadReplace(ctx, s.scripts.libraryCode).Err()
}
