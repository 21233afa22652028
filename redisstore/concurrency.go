package redisstore

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/floodgate/floodgate/core"
	"github.com/floodgate/floodgate/core/slot"

	"github.com/floodgate/floodgate/internal/lib/storekit"
	"github.com/redis/go-redis/v9"
)

// Concurrency limits (slots) on Redis. A key's permits are one sorted set,
// <prefix>{key}:c, member the permit id and score its expiry in µs; the
// key expires with its latest permit. slots.lua applies a batch of
// operations, each slot.Spec.Step, in one script call, on Redis's
// TIME unless the Store has a Clock. The slots are the key's, whichever
// limit applies to them, as a key's rate limit states are.
//
// Operations made while others are in flight go together: a caller that
// finds fewer than slotInflight script calls out sends its own at once;
// the others queue, and when a call returns, the first caller queued sends
// the queue (up to MaxBatch) in the next; its callers are woken as their
// results are set. No goroutine is started but to send a Cluster slot's
// refused call again beside the others (see sendSlots). On a Cluster a
// batch goes as one script call per slot, in one pipeline.

//go:embed slots.lua
var slotsSource string

// The operations' kinds on the wire.
const (
	slotAcquire = "a"
	slotRelease = "r"
	slotExtend  = "e"
)

// slotLuaConstants are the {{NAME}}s of slots.lua.
var slotLuaConstants = map[string]string{
	"SLOT_ACQUIRE": strconv.Quote(slotAcquire),
	"SLOT_RELEASE": strconv.Quote(slotRelease),
	"SLOT_EXTEND":  strconv.Quote(slotExtend),
}

func expandSlotLua(src string) string {
	return luaPlaceholder.ReplaceAllStringFunc(src, func(p string) string {
		v, ok := slotLuaConstants[p[2:len(p)-2]]
		if !ok {
			panic(fmt.Sprintf("redisstore: slots.lua names %s, which slotLuaConstants lacks", p))
		}
		return v
	})
}

// slotInflight is the most script calls of slot operations in flight at
// once per Store: few and full calls cost Redis least.
const slotInflight = 3

// slotKeySuffix ends the Redis key of a key's slots.
const slotKeySuffix = "c"

// slotCall is one operation, queued or sent.
type slotCall struct {
	ctx  context.Context // the caller's
	rkey string
	slot int
	op   slot.Op
	spec slot.Spec
	v    slot.Verdict
	err  error
	// wake receives true when the call is to send batch, false when its
	// result is set.
	wake  chan bool
	batch []*slotCall
}

// slotBatcher queues the slot operations that wait for a script call.
type slotBatcher struct {
	mu       sync.Mutex
	inflight int
	queue    []*slotCall
	// ops and scripts count operations and the script calls that carried
	// them.
	ops, scripts atomic.Uint64
}

// SlotStats are counters of the Store's concurrency limit traffic.
type SlotStats struct {
	Ops         uint64 // acquires, releases and extends sent
	ScriptCalls uint64 // script calls that carried them
}

// SlotStats returns the Store's counters of slot operations.
func (s *Store) SlotStats() SlotStats {
	return SlotStats{Ops: s.slotBatch.ops.Load(), ScriptCalls: s.slotBatch.scripts.Load()}
}

type slotPolicy struct {
	s    *Store
	spec slot.Spec
}

// PrepareSlots implements slot.Store.
func (s *Store) PrepareSlots(spec slot.Spec) (slot.Policy, error) {
	if err := spec.Validate(); err != nil {
		return nil, err
	}
	if s.closed.Load() {
		return nil, core.ErrClosed
	}
	return &slotPolicy{s: s, spec: spec}, nil
}

// slotKey returns the Redis key of key's slots.
func (s *Store) slotKey(key string) string {
	if strings.ContainsAny(key, "{}") {
		return s.prefix + hashTag(key) + key + ":" + slotKeySuffix
	}
	return s.prefix + "{" + key + "}:" + slotKeySuffix
}

// Slot implements slot.Policy.
func (p *slotPolicy) Slot(ctx context.Context, key string, op slot.Op) (slot.Verdict, core.Source, error) {
	if err := storekit.CheckSlotOp(key, op); err != nil {
		return slot.Verdict{}, 0, err
	}
	s := p.s
	if s.closed.Load() {
		return slot.Verdict{}, 0, core.ErrClosed
	}
	if err := ctx.Err(); err != nil {
		return slot.Verdict{}, 0, err
	}
	c := &slotCall{ctx: ctx, rkey: s.slotKey(key), op: op, spec: p.spec, wake: make(chan bool, 1)}
	if s.cluster {
		c.slot = slotOf(c.rkey)
	}
	if err := s.slotDo(ctx, c); err != nil {
		return slot.Verdict{}, 0, err
	}
	if c.err != nil {
		if errors.Is(c.err, slot.ErrInvalidPermit) {
			return slot.Verdict{}, 0, c.err
		}
		return slot.Verdict{}, 0, s.wrap(ctx, c.err)
	}
	return c.v, core.SourceStore, nil
}

// slotDo sends c, alone or with others, and returns when its result is
// set, or with the context's error if it ends while c is still queued.
func (s *Store) slotDo(ctx context.Context, c *slotCall) error {
	b := &s.slotBatch
	b.mu.Lock()
	if b.inflight < slotInflight || s.batch == nil {
		b.inflight++
		b.mu.Unlock()
		s.slotLead([]*slotCall{c})
		return nil
	}
	b.queue = append(b.queue, c)
	b.mu.Unlock()
	var lead bool
	select {
	case lead = <-c.wake:
	case <-ctx.Done():
		b.mu.Lock()
		for i, q := range b.queue {
			if q == c {
				b.queue = append(b.queue[:i], b.queue[i+1:]...)
				b.mu.Unlock()
				return ctx.Err()
			}
		}
		b.mu.Unlock()
		// Sent already, or about to be: its result comes.
		lead = <-c.wake
	}
	if lead {
		s.slotLead(c.batch)
	}
	return nil
}

// slotLead sends batch (whose first call is the caller's own), wakes its
// other callers as their results are set, and hands the queue to the
// first caller queued.
func (s *Store) slotLead(batch []*slotCall) {
	sctx, cancel := slotCallersContext(batch, batchTimeout)
	s.sendSlots(sctx, batch, func(calls []*slotCall) {
		for _, c := range calls {
			if c != batch[0] {
				c.wake <- false
			}
		}
	})
	cancel()
	b := &s.slotBatch
	b.mu.Lock()
	if len(b.queue) == 0 {
		b.inflight--
		b.mu.Unlock()
		return
	}
	k := min(len(b.queue), s.slotMaxBatch())
	next := make([]*slotCall, k)
	copy(next, b.queue)
	b.queue = append(b.queue[:0], b.queue[k:]...)
	b.mu.Unlock()
	next[0].batch = next
	next[0].wake <- true
}

// slotCallersContext returns a context that ends after timeout, or as
// soon as every caller of calls has stopped waiting (as callersContext
// does for decisions): a lone caller's call is bounded by its own
// context, and a batch goes on while anyone waits for it.
func slotCallersContext(calls []*slotCall, timeout time.Duration) (context.Context, context.CancelFunc) {
	// go-redis bounds a read by the context's deadline, not by its
	// cancellation: the deadline is the latest of the callers', when
	// each has one.
	deadline := time.Now().Add(timeout)
	latest, all := time.Time{}, true
	for _, c := range calls {
		d, ok := c.ctx.Deadline()
		all = all && ok
		if d.After(latest) {
			latest = d
		}
	}
	if all && latest.Before(deadline) {
		deadline = latest
	}
	return untilAbandoned(deadline, len(calls), func(i int) context.Context { return calls[i].ctx })
}

func (s *Store) slotMaxBatch() int {
	if s.batch != nil {
		return s.batch.maxBatch
	}
	return 1
}

// sendSlots runs calls in one script call, or, on a Cluster, one per slot
// in one pipeline, sets each call's result, and passes each group of
// calls whose results are set to ready (when not nil), once: the slots
// whose calls go again (see run) do not hold up the others'
// callers, as a slot's move may take seconds.
func (s *Store) sendSlots(ctx context.Context, calls []*slotCall, ready func([]*slotCall)) {
	if ready == nil {
		ready = func([]*slotCall) {}
	}
	groups := [][]*slotCall{calls}
	if s.cluster {
		bySlot := map[int]int{}
		groups = groups[:0]
		for _, c := range calls {
			i, ok := bySlot[c.slot]
			if !ok {
				i = len(groups)
				bySlot[c.slot] = i
				groups = append(groups, nil)
			}
			groups[i] = append(groups[i], c)
		}
	}
	s.slotBatch.ops.Add(uint64(len(calls)))
	s.slotBatch.scripts.Add(uint64(len(groups)))
	if len(groups) == 1 {
		keys, args := s.slotArgs(groups[0])
		res, err := s.runSlots(ctx, keys, args).Result()
		s.slotResults(groups[0], res, err)
		ready(groups[0])
		return
	}
	pipe := s.client.Pipeline()
	cmds := make([]*redis.Cmd, len(groups))
	fns := !s.noFunctions.Load()
	for i, g := range groups {
		keys, args := s.slotArgs(g)
		if fns {
			cmds[i] = fcallCmd(ctx, s.scripts.fns[entrySlots], keys, args)
		} else {
			cmds[i] = evalshaCmd(ctx, s.scripts.hashes[entrySlots], keys, args)
		}
		_ = pipe.Process(ctx, onceCmd{cmds[i]})
	}
	_, _ = pipe.Exec(ctx)
	var again sync.WaitGroup
	loaded := false
	for i, g := range groups {
		res, err := cmds[i].Result()
		if err != nil && (redis.HasErrorPrefix(err, "NOSCRIPT") || functionMissing(err) || functionsRefused(err) || fns && oomRefused(err) || sendAgain(err)) {
			// That master lost its scripts or the library (a restart,
			// a failover), or refuses functions: runSlots loads them
			// again, or uses the script. Or it refused the call before
			// running it (sendAgain), as while the slot is moving:
			// runSlots waits for the move to end, beside the others.
			if functionMissing(err) && !loaded {
				// Once for the batch, not by each slot's call at once.
				s.loadLibrary(ctx) // if it fails, runSlots tries again and says why
				loaded = true
			}
			again.Add(1)
			go func() {
				defer again.Done()
				keys, args := s.slotArgs(g)
				res, err := s.runSlots(ctx, keys, args).Result()
				s.slotResults(g, res, err)
				ready(g)
			}()
			continue
		}
		s.slotResults(g, res, err)
		ready(g)
	}
	again.Wait()
}

// runSlots runs slots.lua, as the library's function while Redis takes
// functions, and again when Redis did not run it: see run. Redis refuses
// a function whole while it is out of memory (one without the allow-oom
// flag may write), where it refuses a script's first write that needs
// memory: then the script runs, so that a release, which frees memory,
// still goes through.
func (s *Store) runSlots(ctx context.Context, keys []string, args []any) *redis.Cmd {
	cmd := s.run(ctx, entrySlots, keys, args)
	if oomRefused(cmd.Err()) && !s.noFunctions.Load() {
		cmd = s.untilRun(ctx, s.evalScript(ctx, entrySlots, keys, args), func() *redis.Cmd {
			return s.evalScript(ctx, entrySlots, keys, args)
		})
	}
	return cmd
}

// oomRefused reports whether err is Redis refusing a command, before it
// ran, for being out of memory (maxmemory with noeviction).
func oomRefused(err error) bool {
	return isRedisError(err) && strings.HasPrefix(err.Error(), "OOM ")
}

func (s *Store) slotArgs(calls []*slotCall) ([]string, []any) {
	keys := make([]string, len(calls))
	args := make([]any, 0, 1+5*len(calls))
	if s.clock != nil {
		args = append(args, s.clock.Now().UnixMicro())
	}
	for i, c := range calls {
		keys[i] = c.rkey
		// The key's TTL in ms for a permit's expiry a lease from now.
		ttl := (c.spec.Lease+999)/1000 + s.extraTTL + 1
		switch c.op.Kind {
		case slot.Release:
			args = append(args, slotRelease, c.op.ID)
		case slot.Extend:
			args = append(args, slotExtend, c.spec.Lease, ttl, c.op.ID)
		default:
			args = append(args, slotAcquire, c.spec.Slots, c.spec.Lease, ttl, c.op.ID)
		}
	}
	return keys, args
}

// errSlotReply is a reply that slots.lua does not give.
var errSlotReply = errors.New("redisstore: malformed reply of the slots script")

// slotResults sets the results of calls from res, slots.lua's reply:
// the one call's answer, or a list of one answer per call.
func (s *Store) slotResults(calls []*slotCall, res any, err error) {
	answers := []any{res}
	if err == nil && len(calls) > 1 {
		var ok bool
		if answers, ok = res.([]any); !ok || len(answers) != len(calls) {
			err = errSlotReply
		}
	}
	if err != nil {
		for _, c := range calls {
			c.err = err
		}
		return
	}
	for i, c := range calls {
		c.v, c.err = slotAnswer(c.op, answers[i])
	}
}

// slotAnswer returns the verdict of op from r, its answer in slots.lua's
// reply.
func slotAnswer(op slot.Op, r any) (slot.Verdict, error) {
	switch r := r.(type) {
	case int64: // 2*held + done: a release, or an extend not done
		if r < 0 || op.Kind == slot.Acquire || op.Kind == slot.Extend && r&1 == 1 {
			return slot.Verdict{}, errSlotReply
		}
		return slot.Verdict{OK: r&1 == 1, Held: r >> 1}, nil
	case string:
		if strings.HasPrefix(r, "FLOODGATE ") {
			if msg, ok := strings.CutPrefix(r, "FLOODGATE permit held already"); ok {
				return slot.Verdict{}, fmt.Errorf("%w: permit %q is held already%s", slot.ErrInvalidPermit, op.ID, msg)
			}
			return slot.Verdict{}, errors.New(r)
		}
		// "E H", a done acquire or extend, or "-R H", a denied acquire.
		a, b, ok := strings.Cut(r, " ")
		t, err1 := strconv.ParseInt(a, 10, 64)
		held, err2 := strconv.ParseInt(b, 10, 64)
		if !ok || err1 != nil || err2 != nil || held < 0 || t == 0 || op.Kind == slot.Release || t < 0 && op.Kind != slot.Acquire {
			return slot.Verdict{}, errSlotReply
		}
		if t < 0 {
			return slot.Verdict{Held: held, Retry: -t}, nil
		}
		return slot.Verdict{OK: true, Held: held, Expiry: t}, nil
	}
	return slot.Verdict{}, errSlotReply
}

//go:embed slotspeek.lua
var slotsPeekSource string

var slotsPeekScript = redis.NewScript(slotsPeekSource)

var _ slot.Inspector = (*slotPolicy)(nil)

// InspectSlots implements slot.Inspector: one script call of its own
// (slotspeek.lua, read-only, within ACLCommands), not batched, since it
// serves the explain API and not decisions.
func (p *slotPolicy) InspectSlots(ctx context.Context, key string) (slot.Inspection, error) {
	if err := storekit.CheckKey(key); err != nil {
		return slot.Inspection{}, err
	}
	s := p.s
	if s.closed.Load() {
		return slot.Inspection{}, core.ErrClosed
	}
	now := int64(-1)
	if s.clock != nil {
		now = s.clock.Now().UnixMicro()
	}
	res, err := slotsPeekScript.Run(ctx, s.client, []string{s.slotKey(key)}, now).Int64Slice()
	if err != nil {
		return slot.Inspection{}, s.wrap(ctx, err)
	}
	if len(res) != 3 {
		return slot.Inspection{}, fmt.Errorf("%w: %w", core.ErrStore, errSlotReply)
	}
	return slot.Inspection{Now: res[0], Held: res[1], Earliest: res[2], Source: core.SourceStore}, nil
}
