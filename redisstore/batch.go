package redisstore

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"math/bits"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/floodgate/floodgate"
	"github.com/redis/go-redis/v9"
)

// call is one decision on its way to Redis: its keys and its part of the
// script's arguments, and, once done, its result.
type call struct {
	ctx   context.Context // the caller's, for a call sent on its own
	keys  []string
	n     int64
	now   int64      // µs, or -1 for the server's TIME
	specs [][7]int64 // per limit: kind, quota, rate, period, c0, c1, c2
	nk    int
	slot  int // the Cluster slot of its keys; 0 outside a cluster

	out   []int64 // 4 per limit
	err   error
	ready chan struct{} // closed when out or err is set
}

// batcher sends concurrent calls to Redis together. A call that finds
// nothing in flight goes out at once, on its caller's goroutine, so one
// goroutine never waits for a batch; calls that arrive while others are
// in flight queue, and the next free worker sends everything queued in one
// script call per Cluster slot (one EVALSHA on a standalone server). At
// most maxInflight script calls (or pipelines) are in flight at once.
type batcher struct {
	s           *Store
	maxInflight int
	maxBatch    int
	timeout     time.Duration

	mu       sync.Mutex
	pending  []*call
	inflight int
	closed   bool

	scripts, decisions atomic.Uint64 // script calls made, decisions they carried

	wake chan struct{} // a worker should look at pending
	stop chan struct{}
	wg   sync.WaitGroup
}

func newBatcher(s *Store, maxInflight, maxBatch int, timeout time.Duration) *batcher {
	b := &batcher{s: s, maxInflight: maxInflight, maxBatch: maxBatch, timeout: timeout,
		wake: make(chan struct{}, 1), stop: make(chan struct{})}
	for range maxInflight {
		b.wg.Add(1)
		go b.worker()
	}
	return b
}

// close stops the workers after they finish what they are sending; calls
// still queued fail with floodgate.ErrClosed.
func (b *batcher) close() {
	close(b.stop)
	b.wg.Wait()
	b.mu.Lock()
	b.closed = true
	pending := b.pending
	b.pending = nil
	b.mu.Unlock()
	for _, c := range pending {
		c.err = floodgate.ErrClosed
		close(c.ready)
	}
}

func (b *batcher) signal() {
	select {
	case b.wake <- struct{}{}:
	default:
	}
}

// do sends c and waits for its result, or for ctx to end.
func (b *batcher) do(c *call) error {
	b.mu.Lock()
	if b.inflight == 0 && len(b.pending) == 0 {
		// Nothing in flight: no reason to wait for company.
		b.inflight++
		b.mu.Unlock()
		b.s.send(c.ctx, []*call{c})
		b.finished()
		return c.err
	}
	if b.closed {
		b.mu.Unlock()
		return floodgate.ErrClosed
	}
	c.ready = make(chan struct{})
	b.pending = append(b.pending, c)
	b.mu.Unlock()
	b.signal()
	select {
	case <-c.ready:
		return c.err
	case <-c.ctx.Done():
		// The batch will still decide it: the caller just stops waiting,
		// as it would stop waiting for a reply of its own.
		return c.ctx.Err()
	}
}

// finished records the end of a script call and wakes a worker if calls
// are waiting.
func (b *batcher) finished() {
	b.mu.Lock()
	b.inflight--
	more := len(b.pending) > 0
	b.mu.Unlock()
	if more {
		b.signal()
	}
}

func (b *batcher) worker() {
	defer b.wg.Done()
	batch := make([]*call, 0, b.maxBatch)
	for {
		select {
		case <-b.wake:
		case <-b.stop:
			return
		}
		for {
			b.mu.Lock()
			if len(b.pending) == 0 || b.inflight >= b.maxInflight {
				b.mu.Unlock()
				break
			}
			k := min(len(b.pending), b.maxBatch)
			batch = append(batch[:0], b.pending[:k]...)
			rest := copy(b.pending, b.pending[k:])
			clear(b.pending[rest:])
			b.pending = b.pending[:rest]
			b.inflight++
			b.mu.Unlock()
			if rest > 0 {
				b.signal() // another worker can take the rest
			}
			ctx, cancel := context.WithTimeout(context.Background(), b.timeout)
			b.s.send(ctx, batch)
			cancel()
			b.finished()
		}
	}
}

// send runs calls in as few script calls as the Cluster's slots allow,
// and sets every call's result. ctx bounds the script calls.
func (s *Store) send(ctx context.Context, calls []*call) {
	defer func() {
		for _, c := range calls {
			if c.ready != nil {
				close(c.ready)
			}
		}
	}()
	groups := [][]*call{calls}
	if s.cluster {
		groups = groupBySlot(calls)
	}
	if len(groups) == 1 {
		s.sendGroup(ctx, groups[0])
		return
	}
	var wg sync.WaitGroup
	for _, g := range groups {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s.sendGroup(ctx, g)
		}()
	}
	wg.Wait()
}

func groupBySlot(calls []*call) [][]*call {
	bySlot := map[int][]*call{}
	var order []int
	for _, c := range calls {
		if _, ok := bySlot[c.slot]; !ok {
			order = append(order, c.slot)
		}
		bySlot[c.slot] = append(bySlot[c.slot], c)
	}
	groups := make([][]*call, len(order))
	for i, slot := range order {
		groups[i] = bySlot[slot]
	}
	return groups
}

// sendGroup runs calls whose keys share a slot in one script call.
func (s *Store) sendGroup(ctx context.Context, calls []*call) {
	if !s.noFastPath && len(calls) <= pipelineMax && allBucket(calls) {
		if len(calls) == 1 {
			s.sendBucket(ctx, calls[0])
			return
		}
		if s.fnReady.Load() {
			s.sendPipelined(ctx, calls)
			return
		}
	}
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
	index := make(map[[7]int64]int, 4)
	var specs [][7]int64
	reqArgs := 0
	for _, c := range calls {
		for _, sp := range c.specs {
			if _, ok := index[sp]; !ok {
				index[sp] = len(specs) + 1
				specs = append(specs, sp)
			}
		}
		reqArgs += 3 + len(c.specs)
	}
	args := make([]any, 0, 3+7*len(specs)+reqArgs)
	args = append(args, s.extraTTL, len(specs))
	for _, sp := range specs {
		for _, v := range sp {
			args = append(args, v)
		}
	}
	args = append(args, len(calls))
	for _, c := range calls {
		args = append(args, c.nk, c.n, c.now)
		for _, sp := range c.specs {
			args = append(args, index[sp])
		}
	}
	if s.batch != nil {
		s.batch.scripts.Add(1)
		s.batch.decisions.Add(uint64(len(calls)))
	}
	res, err := decideScript.Run(ctx, s.client, keys, args...).Slice()
	if err != nil {
		for _, c := range calls {
			c.err = s.wrap(c.ctx, err)
		}
		return
	}
	i := 0
	for _, c := range calls {
		if i < len(res) {
			if msg, ok := res[i].(string); ok {
				c.err = s.wrap(c.ctx, errors.New(msg))
				i++
				continue
			}
		}
		if i+4*c.nk > len(res) {
			c.err = fmt.Errorf("%w: script returned %d values for %d requests", floodgate.ErrStore, len(res), len(calls))
			continue
		}
		c.out = make([]int64, 4*c.nk)
		for j := range c.out {
			v, ok := res[i+j].(int64)
			if !ok {
				c.err = fmt.Errorf("%w: script returned %T, not an integer", floodgate.ErrStore, res[i+j])
				break
			}
			c.out[j] = v
		}
		i += 4 * c.nk
	}
}

// slotOf returns the Redis Cluster slot of key: CRC16 of its hash tag (the
// part between the first { and the next }, when not empty) modulo 16384.
func slotOf(key string) int {
	if s := strings.IndexByte(key, '{'); s >= 0 {
		if e := strings.IndexByte(key[s+1:], '}'); e > 0 {
			key = key[s+1 : s+1+e]
		}
	}
	var crc uint16
	for i := 0; i < len(key); i++ {
		crc = crc<<8 ^ crc16Table[byte(crc>>8)^key[i]]
	}
	return int(crc) & 16383
}

// crc16Table is CRC-16/XMODEM (polynomial 0x1021), which Redis Cluster
// uses for key slots.
var crc16Table = func() (t [256]uint16) {
	for i := range t {
		crc := uint16(i) << 8
		for range 8 {
			if crc&0x8000 != 0 {
				crc = crc<<1 ^ 0x1021
			} else {
				crc <<= 1
			}
		}
		t[i] = crc
	}
	return t
}()

// pipelineMax is the largest batch of lone bucket decisions that goes out
// as a pipeline of fast-path function calls, one per decision, rather than
// as one decide.lua call: for a few decisions, the fast path's lower cost
// per call outweighs decide.lua's sharing of one call among them. Each
// function call is atomic and they run in order, so the results are those
// of one call after the other.
const pipelineMax = 4

// allBucket reports whether every call is one request on one bucket limit,
// which the fast path decides.
func allBucket(calls []*call) bool {
	for _, c := range calls {
		if c.nk != 1 || c.specs[0][0] != 1 {
			return false
		}
	}
	return true
}

// sendPipelined decides lone bucket decisions with one fast-path function
// call each, in one pipeline. The library is known to be loaded; a call
// that finds it gone (FUNCTION FLUSH, a failover) was not run, and is sent
// again on its own, which loads it.
func (s *Store) sendPipelined(ctx context.Context, calls []*call) {
	if s.batch != nil {
		s.batch.scripts.Add(uint64(len(calls)))
		s.batch.decisions.Add(uint64(len(calls)))
	}
	pipe := s.client.Pipeline()
	cmds := make([]*redis.Cmd, len(calls))
	for i, c := range calls {
		cmds[i] = pipe.FCall(ctx, bucketFunction, c.keys, bucketArg(c, s.extraTTL))
	}
	_, _ = pipe.Exec(ctx) // each command carries its own error
	for i, c := range calls {
		if functionMissing(cmds[i].Err()) {
			s.fnReady.Store(false)
			c.out, c.err = s.bucketResult(c, s.runBucket(ctx, c.keys, bucketArg(c, s.extraTTL)))
			continue
		}
		c.out, c.err = s.bucketResult(c, cmds[i])
	}
}

// sendBucket decides one request on one bucket limit with the fast path.
func (s *Store) sendBucket(ctx context.Context, c *call) {
	if s.batch != nil {
		s.batch.scripts.Add(1)
		s.batch.decisions.Add(1)
	}
	c.out, c.err = s.bucketResult(c, s.runBucket(ctx, c.keys, bucketArg(c, s.extraTTL)))
}

// bucketArg packs the fast path's arguments (see bucket.lua).
func bucketArg(c *call, extraTTL int64) string {
	sp := &c.specs[0]
	quota, rate, period := sp[1], sp[2], sp[3]
	tauQ, tauR := mulDiv(quota, period, rate)
	iq, ir := mulDiv(c.n, period, rate)
	var buf [80]byte
	for i, v := range [10]int64{c.now, c.n, extraTTL, quota, rate, period, tauQ, tauR, iq, ir} {
		binary.BigEndian.PutUint64(buf[8*i:], math.Float64bits(float64(v)))
	}
	return string(buf[:])
}

// bucketResult reads the fast path's reply to c.
func (s *Store) bucketResult(c *call, cmd *redis.Cmd) ([]int64, error) {
	out, err := cmd.Int64Slice()
	switch {
	case err != nil:
		return nil, s.wrap(c.ctx, err)
	case len(out) != 4:
		return nil, fmt.Errorf("%w: script returned %d values for one limit", floodgate.ErrStore, len(out))
	}
	return out, nil
}

// runBucket runs the fast path: with FCALL while Redis takes it, and with
// EVALSHA otherwise.
func (s *Store) runBucket(ctx context.Context, keys []string, arg string) *redis.Cmd {
	if s.noFunctions.Load() {
		return bucketScript.Run(ctx, s.client, keys, arg)
	}
	cmd := s.client.FCall(ctx, bucketFunction, keys, arg)
	if functionMissing(cmd.Err()) {
		// Never loaded here, flushed, or a failover to a server without
		// it: load it, then call again.
		if err := s.loadLibrary(ctx); err != nil {
			if !isRedisError(err) {
				cmd.SetErr(err) // a failure to reach Redis
				return cmd
			}
			s.noFunctions.Store(true) // refused: use scripts
			return bucketScript.Run(ctx, s.client, keys, arg)
		}
		cmd = s.client.FCall(ctx, bucketFunction, keys, arg)
	}
	err := cmd.Err()
	switch {
	case err == nil:
		s.fnReady.Store(true)
		return cmd
	case functionMissing(err):
		// Still not found after loading: this call uses a script.
	case isRedisError(err) && (strings.HasPrefix(err.Error(), "ERR unknown command") || strings.HasPrefix(err.Error(), "NOPERM")):
		s.noFunctions.Store(true) // Redis 6, or an ACL without FCALL
	default:
		return cmd // a failure to reach Redis, or the function's own error
	}
	return bucketScript.Run(ctx, s.client, keys, arg)
}

// functionMissing reports whether err is Redis saying the library is not
// loaded: the call was not run.
func functionMissing(err error) bool {
	return isRedisError(err) && strings.HasPrefix(err.Error(), "ERR Function not found")
}

func isRedisError(err error) bool {
	var rerr redis.Error
	return errors.As(err, &rerr)
}

// loadLibrary loads the function library on the server, or on every
// master of a cluster (replicas get it from their master).
func (s *Store) loadLibrary(ctx context.Context) error {
	if cc, ok := s.client.(*redis.ClusterClient); ok {
		return cc.ForEachMaster(ctx, func(ctx context.Context, c *redis.Client) error {
			return c.FunctionLoadReplace(ctx, libraryCode).Err()
		})
	}
	return s.client.FunctionLoadReplace(ctx, libraryCode).Err()
}

// mulDiv returns floor(a*b/c) and the remainder, exactly, as the script's
// muldiv does, for 0 <= a, b and 0 < c. A cost so large that the quotient
// overflows is denied by its size before its time matters; it saturates.
func mulDiv(a, b, c int64) (q, r int64) {
	hi, lo := bits.Mul64(uint64(a), uint64(b))
	if hi >= uint64(c) {
		return 1 << 53, 0
	}
	qq, rr := bits.Div64(hi, lo, uint64(c))
	if qq >= 1<<53 {
		return 1 << 53, 0
	}
	return int64(qq), int64(rr)
}
