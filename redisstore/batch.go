package redisstore

import (
	"context"
	"github.com/floodgate/floodgate/core"
	"sync"
	"sync/atomic"
	"time"

	"github.com/floodgate/floodgate"
)

// This file batches concurrent decisions. script.go sends a batch as one
// call of decide.lua; fastpath.go sends a batch made only of lone bucket
// decisions through bucket.lua; slots.go groups a batch by Cluster slot.

// call is one decision on its way to Redis: its keys and its part of the
// script's arguments, and, once done, its result.
type call struct {
	ctx  context.Context // the caller's, for a call sent on its own
	p    *policy
	keys []string // the Redis keys of its limits (a group's: its members')
	// Its key's override key, and its keys then that key: what a script
	// call of the request alone declares (see fill). "" and nil for a
	// group.
	okey     string
	declared []string
	n        int64
	op       op           // take, charge or refund n
	now      int64        // µs, or -1 for the server's TIME
	specs    []scriptSpec // per limit, its parameters (p.params, or the calendar's)
	slot     int          // the Cluster slot of its keys; 0 outside a cluster

	// A group (see Store.TakeGroup) is one call whose keys are its
	// members', decided in one script call: group holds the members, and
	// all makes it all or nothing. advisory marks a member whose denial
	// does not undo its group.
	group    []*call
	all      bool
	advisory bool

	out    []int64     // 4 per limit
	limits []core.Spec // the key's override, when the reply carried one
	err    error

	// A call that queues waits for ready, which gets one value when out or
	// err is set; queued says it waits. Its caller sets abandoned when it
	// stops waiting first: the batch still holds the call then, which must
	// not be used again (see Store.put).
	ready     chan struct{}
	queued    bool
	abandoned bool
	asked     time.Time // when it queued
	work      int64     // its sliding-log work (logWork), set as it queues

	// The storage of declared (so keys) and out for a lone limit, of
	// the fast path's argument for a lone call, and of the batch that
	// holds c alone (see alone), so that a decision allocates none of
	// them.
	kbuf [2]string
	obuf [4]int64
	abuf [1]any
	one  [1]*call
}

// op is what a call does with its cost, as decide.lua's modes.
type op uint8

const (
	opTake   op = iota // charge it if every limit allows (core.Spec.Step)
	opCharge           // charge it whatever the limits say (core.Spec.Charge)
	opRefund           // give it back (core.Spec.Refund)
)

// batcher sends concurrent calls to Redis together. A call that finds
// room for another script call and nothing queued goes out at once, on its
// caller's goroutine, so one goroutine never waits for a batch, nor for a
// worker to wake; calls that arrive while there is no room queue, and the
// next free worker sends everything queued in one script call. There is
// room while fewer than maxInflight script calls are in flight (fewer,
// down to two, while they queue at Redis: see adapt), and fewer than a
// quarter as many (but three) while the script calls that go out carry
// smallBatch calls or more, a call then going out beside another only
// with half a batch (see room). On a Cluster each master queues
// on its own instead, and a batch for a master goes out as one script
// call across its slots, or a pipeline of one per slot (see doCluster).
type batcher struct {
	s           *Store
	maxInflight int
	maxBatch    int
	timeout     time.Duration

	mu       sync.Mutex
	pending  []*call
	work     int64 // the log work of pending, added up (see fit)
	inflight int   // script calls in flight
	// size is how many calls the script calls carried as they went out,
	// averaged over the last few (an exponentially weighted moving
	// average, of weight 1/8, in 256ths of a call).
	size int
	// The room while batches are small climbs toward the least wait (see
	// adapt): limit is between two and maxInflight (0: not adapted yet,
	// maxInflight), and step the direction it moves in, +1 or -1.
	limit, step int
	finishes    int   // script calls finished in this window
	waits       int64 // ns: the waits of their decisions, added up
	waited      int64 // decisions they carried
	last        int64 // ns: the mean wait of the last window (0: none)
	now         func() time.Time
	closed      bool
	masters     map[string]*masterQueue // on a Cluster: each master's own queue, by address
	mastersWG   sync.WaitGroup          // the master queues' sending goroutines
	// On a Cluster: the calls in the masters' queues and script calls,
	// added up (see linger).
	callers int

	scripts, decisions atomic.Uint64 // script calls made, decisions they carried
	trips              atomic.Uint64 // round trips that carried the script calls

	wake chan struct{} // a worker should look at pending
	stop chan struct{}
	wg   sync.WaitGroup
}

// smallBatch is the batch size below which the batcher lets maxInflight
// script calls out, rather than a quarter as many: small batches mean the
// wait is the round trip, which parallel calls shorten; large ones mean
// Redis is the bottleneck, which fewer, larger calls relieve. Guarded by
// bench's redisbench at 8 and 64 goroutines.
const smallBatch = 4

func newBatcher(s *Store, maxInflight, maxBatch int, timeout time.Duration, now func() time.Time) *batcher {
	b := &batcher{s: s, maxInflight: maxInflight, maxBatch: maxBatch, timeout: timeout, now: now,
		wake: make(chan struct{}, 1), stop: make(chan struct{})}
	if s.cluster {
		b.masters = map[string]*masterQueue{}
		return b
	}
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
	b.pending, b.work = nil, 0
	for _, q := range b.masters {
		pending = append(pending, q.pending...)
		q.pending = nil
		if q.timer != nil {
			q.timer.Stop()
		}
	}
	b.mu.Unlock()
	b.mastersWG.Wait()
	for _, c := range pending {
		c.err = floodgate.ErrClosed
		c.ready <- struct{}{}
	}
}

// get returns a call to fill, cleared, taken from the calls that callers
// put back (see put): a call and its channel were most of a decision's
// allocations.
func (s *Store) get() *call {
	c, _ := s.calls.Get().(*call)
	if c == nil {
		return &call{}
	}
	return c
}

// put gives c back for a later decision once its caller is done with it:
// unless its caller stopped waiting for it (abandoned), no batch holds it
// any more. It keeps c's channel, which is empty, and nothing else.
func (s *Store) put(c *call) {
	if c.abandoned {
		return
	}
	*c = call{ready: c.ready}
	s.calls.Put(c)
}

// wait makes c a call that queues: its caller waits for ready.
func (c *call) wait() {
	if c.ready == nil {
		c.ready = make(chan struct{}, 1)
	}
	c.queued = true
}

// room reports whether a script call of k calls may go out now: fewer
// than maxInflight are in flight, and, if the script calls that went out
// lately carried smallBatch calls or more, fewer than a quarter as many
// (rounded up), or three, whichever is more (never more than maxInflight),
// and then, while any is in flight, only with at least half as many
// calls as those carried. b.mu is held.
//
// Batches that large mean that many decisions wait: Redis, or the CPU
// that the client shares with it, is then the bottleneck, and each
// script call costs about as much as a few decisions, so fewer calls in
// flight, with larger batches, decide more. With batches smaller than
// that, the wait is the round trip, and more of them in parallel decide
// more.
//
// Three rather than two: with two, Redis waited between calls while the
// client read one's reply and the next gathered. Guarded by bench's
// redisbench at 64 goroutines on 10,000 keys.
//
// While a large batch is in flight, Redis is busy with it: a call that
// went out beside it with the first caller to come would wait behind it
// there, and cost Redis and the client a script call for one decision;
// requests that reach the store one at a time (a service's, through its
// server) would often make such calls of one. So they wait for company here instead, and go with half a batch,
// early enough to keep Redis busy, or when nothing is in flight.
func (b *batcher) room(k int) bool {
	limit := b.smallLimit()
	if b.size >= smallBatch<<8 {
		limit = min(b.maxInflight, max(3, (b.maxInflight+3)/4)) // 8 → 3, 16 → 4
		if b.inflight > 0 && k<<9 < b.size {
			return false // fewer than half the recent batches' size (in 256ths)
		}
	}
	return b.inflight < limit
}

// sendable reports whether a worker can send what is queued now: calls
// wait, and there is room for a script call of them (see next). b.mu is
// held.
func (b *batcher) sendable() bool {
	k, _, full := b.next()
	return k > 0 && b.room(full)
}

// next returns how many of the calls queued go out in the next script
// call and their log work (see fit), and the batch size that room should
// judge it by: a call that the log budget closed is a full one, not one
// that would go out early with few calls. b.mu is held.
func (b *batcher) next() (k int, work int64, full int) {
	k, work = b.fit(b.pending, b.work)
	if k < min(len(b.pending), b.maxBatch) {
		return k, work, b.maxBatch
	}
	return k, work, k
}

// maxBatchLogWork bounds the sliding-log work of one script call (see
// logWork): a few of the heaviest requests' worth, so that no batch holds
// Redis, and every other client, for more than a few milliseconds.
const maxBatchLogWork = 4 * core.MaxLogQuota

// removedPerWritten is how many sliding-log members that a script removes
// (expired or refunded) count as one that it writes: ZREMRANGE drops a
// member for well under an eighth of what decide.lua's ZADD of a new name
// costs, so an eighth leaves a margin.
const removedPerWritten = 8

// fit returns how many of queue, from its first, go out in one script
// call, and their log work added up: up to maxBatch, and beyond the first
// only while their log work stays within maxBatchLogWork. The first always
// goes, as one request's work is bounded already (core.MaxLogQuota), and
// a call that does not fit is the first of the next, so none waits for
// long. work is queue's added up: with no sliding log queued it is 0, and
// costs no more than that comparison.
func (b *batcher) fit(queue []*call, work int64) (int, int64) {
	k := min(len(queue), b.maxBatch)
	if work == 0 || k == 0 || (k == len(queue) && work <= maxBatchLogWork) {
		return k, work
	}
	w := queue[0].work
	for i := 1; i < k; i++ {
		if w+queue[i].work > maxBatchLogWork {
			return i, w
		}
		w += queue[i].work
	}
	return k, w
}

// logWork returns the most sliding-log work that c can cost a script
// call: a group's, its members' added up. It counts the limits of c's
// Policy, which is all the batcher knows: a key's override that is a
// sliding log, or a log that another Policy with a larger limit filled,
// can cost more, so a batch of such requests is bounded only by maxBatch
// times one request's work (core.MaxLogQuota), as before. An
// all-or-nothing group that is undone also removes what it wrote, which
// the margin in removedPerWritten absorbs.
func (c *call) logWork() int64 {
	if c.group == nil {
		return c.p.logWork(c.n, c.op)
	}
	var w int64
	for _, m := range c.group {
		w += m.p.logWork(m.n, m.op)
	}
	return w
}

// logWork returns the most sliding-log work of a request of cost n doing o
// on p's limits, in members written, a member removed counting
// 1/removedPerWritten: each log may expire up to twice its limit (the
// most a forced charge fills it to), a take writes n members on each log
// (if n fits every limit), a forced charge up to twice the limit, and a
// refund removes up to as many. 0 without a sliding log.
func (p *policy) logWork(n int64, o op) int64 {
	if p.logs == 0 {
		return 0
	}
	each := min(n, 2*core.MaxLogQuota) // no overflow in each*p.logs
	var written int64
	removed := 2 * p.logQuota
	switch o {
	case opTake:
		written = min(each*p.logs, p.logQuota)
	case opCharge:
		written = min(each*p.logs, 2*p.logQuota)
	case opRefund:
		removed += min(each*p.logs, 2*p.logQuota)
	}
	return written + (removed+removedPerWritten-1)/removedPerWritten
}

// smallLimit is the room while batches are small: the limit adapt climbs
// with, or maxInflight before it has moved. b.mu is held.
func (b *batcher) smallLimit() int {
	if b.limit == 0 {
		return b.maxInflight
	}
	return b.limit
}

// Adapting the room while batches are small: the batcher climbs toward
// the number in flight at which a decision waits least. Every adaptEvery
// script calls it takes the mean wait of the decisions they carried, from
// the moment each was asked for to its result, moves the limit one step,
// and keeps the direction while the mean falls, turning back when it
// rises or at a bound (2 and maxInflight). So it settles around the best
// limit, whatever makes it best: where calls queue at Redis (or for the
// CPU the client shares with it), fewer in flight carry more decisions
// each for less of Redis's time per decision; where the wait is the round
// trip, more in parallel shorten it. With a fixed number of callers, the
// least wait is also the most decisions a second.
//
// Climbing, rather than a fixed rule, because the best number in flight
// differs from machine to machine. The means are noisy, so the limit
// wanders a step or two around the best, which costs little: the wait
// changes slowly near it. Guarded by bench's redisbench at 8 goroutines.
const adaptEvery = 256

// adapt records a script call of k decisions whose waits add up to wait
// (ns) and, every adaptEvery calls, moves the room a step (see above).
// b.mu is held.
func (b *batcher) adapt(k int, wait int64) {
	if wait <= 0 || k <= 0 {
		return // a clock that does not move
	}
	if b.size >= smallBatch<<8 {
		// The large batches' rule holds (see room): what waits then says
		// nothing of the limit.
		b.waits, b.waited, b.finishes = 0, 0, 0
		return
	}
	b.waits += wait
	b.waited += int64(k)
	if b.finishes++; b.finishes < adaptEvery {
		return
	}
	mean := b.waits / b.waited
	b.waits, b.waited, b.finishes = 0, 0, 0
	b.limit = b.smallLimit()
	if b.step == 0 {
		b.step = -1
	}
	if b.last != 0 && mean > b.last {
		b.step = -b.step // worse than the last step: turn back
	}
	b.last = mean
	lo := min(2, b.maxInflight)
	if next := b.limit + b.step; next < lo || next > b.maxInflight {
		b.step = -b.step // at a bound: back from it
	}
	b.limit = max(lo, min(b.maxInflight, b.limit+b.step))
}

// out records a script call of k calls going out. b.mu is held.
func (b *batcher) out(k int) {
	b.inflight++
	d := k<<8 - b.size
	if d > 0 {
		d += 7 // rounded up, so that a steady size is reached
	}
	b.size += d / 8
}

func (b *batcher) signal() {
	select {
	case b.wake <- struct{}{}:
	default:
	}
}

// do sends c and waits for its result, or for ctx to end.
func (b *batcher) do(c *call) error {
	if b.masters != nil {
		return b.doCluster(c)
	}
	// When the caller asked, read before the lock rather than under it:
	// the start of its round trip if it goes out at once, of its wait if
	// it queues.
	asked := b.now()
	c.work = c.logWork()
	b.mu.Lock()
	if len(b.pending) == 0 && b.room(1) && !b.closed {
		// Room for another script call and nothing queued: no reason to
		// wait for company, or for a worker to wake.
		b.out(1)
		b.mu.Unlock()
		b.s.send(c.ctx, []*call{c})
		b.finished(1, int64(b.now().Sub(asked)))
		return c.err
	}
	if b.closed {
		b.mu.Unlock()
		return floodgate.ErrClosed
	}
	c.wait()
	c.asked = asked
	b.pending = append(b.pending, c)
	b.work += c.work
	// A worker is woken only when it can send: room opens otherwise only
	// as a script call ends, and finished wakes one then.
	wake := b.sendable()
	b.mu.Unlock()
	if wake {
		b.signal()
	}
	select {
	case <-c.ready:
		return c.err
	case <-c.ctx.Done():
		// The batch will still decide it: the caller just stops waiting,
		// as it would stop waiting for a reply of its own.
		c.abandoned = true
		return c.ctx.Err()
	}
}

// masterQueue is one Cluster master's part of the batcher: how many
// script calls (or pipelines) to it are in flight, and the calls that
// wait for one to end.
type masterQueue struct {
	inflight int
	pending  []*call
	work     int64 // the log work of pending, added up (see fit)
	// size is how many calls its script calls carried as they went out,
	// averaged as the batcher's size is (see out), in 256ths of a call.
	size int
	// large says that its batches are large (see room): set when size
	// reaches smallBatch, cleared when it falls below half that, so
	// that the lone calls that go out while nothing is in flight do not
	// tip it back and forth.
	large bool
	// starting says that a goroutine that will take the next batch has
	// not started yet (see sendQueued).
	starting bool
	// Lingering for company (see linger): since is when the oldest call
	// of pending queued; rtt is the master's script calls' round trip,
	// averaged as size is, in ns; lingering says that pending waits, and
	// timer sends it when it has waited long enough, if nothing sent it
	// before.
	since     time.Time
	rtt       int64
	lingering bool
	timer     *time.Timer
}

// masterInflight is how many script calls a Cluster master may have in
// flight while they carry fewer than smallBatch calls: then the wait is
// the round trip, and calls side by side shorten it. Two, not more: with
// four, masters that share the callers (64 callers over 6 masters) kept
// their batches small, each script call costing Redis and the client as
// much as a few decisions. Guarded by bench's redisbench -cluster.
const masterInflight = 2

// masterLarge is how many script calls the masters of a Cluster have in
// flight, added up, while their calls carry smallBatch calls or more: as
// many as a standalone server has then (see room), shared among the
// masters, at least one each. Large batches mean that callers wait for
// Redis or for the CPU: fewer, larger script calls decide more then.
// Guarded by bench's redisbench -cluster.
const masterLarge = 3

// room reports whether a script call of k calls may go out to q's master
// now, with masters masters known: below masterInflight while its batches
// are small; while they are large, below its share of masterLarge, and
// beside another in flight only with half as many calls as they carried.
// b.mu is held.
func (q *masterQueue) room(k, masters int) bool {
	if !q.large {
		return q.inflight < masterInflight
	}
	if q.inflight > 0 && k<<9 < q.size {
		return false
	}
	return q.inflight < max(1, masterLarge/max(masters, 1))
}

// sized records a script call of k calls going out to q's master. b.mu
// is held.
func (q *masterQueue) sized(k int) {
	d := k<<8 - q.size
	if d > 0 {
		d += 7 // rounded up, as the batcher's
	}
	q.size += d / 8
	switch {
	case q.size >= smallBatch<<8:
		q.large = true
	case q.size < smallBatch<<7:
		q.large = false
	}
}

// doCluster is do on a Cluster. Calls queue by the master of their slot,
// as the client's view of the cluster has it: each master has a few
// script calls in flight (see room), and the calls that arrive meanwhile
// go out together in its next one, a script call across its slots for the
// fast path's (cross.go), or one per slot in a pipeline. So a master that
// is slow or down holds up only the calls for its own slots, never those
// for a healthy master's, and the calls in flight are bounded by the
// callers waiting.
func (b *batcher) doCluster(c *call) error {
	addr := b.s.masterOf(c.ctx, c.keys[0])
	c.work = c.logWork()
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		return floodgate.ErrClosed
	}
	q := b.masters[addr]
	if q == nil {
		q = &masterQueue{}
		b.masters[addr] = q
	}
	b.callers++
	if len(q.pending) == 0 && !q.large && q.room(1, len(b.masters)) {
		q.inflight++
		q.sized(1)
		b.mu.Unlock()
		start := time.Now()
		b.s.sendGroup(c.ctx, []*call{c})
		b.masterDone(addr, 1, time.Since(start))
		return c.err
	}
	c.wait()
	if len(q.pending) == 0 {
		q.since = time.Now()
	}
	q.pending = append(q.pending, c)
	q.work += c.work
	b.sendQueued(addr, q)
	b.mu.Unlock()
	select {
	case <-c.ready:
		return c.err
	case <-c.ctx.Done():
		c.abandoned = true
		return c.ctx.Err() // the queued call is still decided
	}
}

// sendQueued sends what waits for q's master, on goroutines of their own,
// while there is room for it. b.mu is held.
//
// While the master's batches are large, the goroutine takes its batch
// when it starts rather than now: the callers that queue before it runs
// go with it. Large batches mean that callers wait for Redis or for the
// CPU, so it seldom waits long, and a script call of one that went
// out at once would cost Redis and the client as much as several
// decisions.
func (b *batcher) sendQueued(addr string, q *masterQueue) {
	for len(q.pending) > 0 && !b.closed && !q.starting {
		k, _ := b.fit(q.pending, q.work)
		full := k
		if k < min(len(q.pending), b.maxBatch) {
			full = b.maxBatch // closed by the log budget: a full one
		}
		if !q.room(full, len(b.masters)) || b.linger(addr, q) {
			return
		}
		q.inflight++
		var batch []*call
		if q.large {
			q.starting = true
		} else {
			batch = b.take(q)
		}
		b.mastersWG.Add(1)
		go func() {
			defer b.mastersWG.Done()
			if batch == nil {
				b.mu.Lock()
				q.starting = false
				if len(q.pending) > 0 && !b.closed {
					batch = b.take(q)
				}
				b.mu.Unlock()
			}
			var took time.Duration
			if len(batch) > 0 {
				start := time.Now()
				ctx, cancel := callersContext(batch, b.timeout)
				b.s.sendPipeline(ctx, batch)
				cancel()
				took = time.Since(start)
			}
			b.masterDone(addr, len(batch), took)
		}()
	}
}

// take removes the calls of q's next script call from its queue and
// returns them. b.mu is held.
func (b *batcher) take(q *masterQueue) []*call {
	// The pipeline's script calls run one after another: their log work
	// is bounded together, as one script call's.
	k, work := b.fit(q.pending, q.work)
	q.work -= work
	batch := make([]*call, k)
	copy(batch, q.pending)
	rest := copy(q.pending, q.pending[k:])
	clear(q.pending[rest:])
	q.pending = q.pending[:rest]
	q.sized(k)
	return batch
}

// masterDone ends one of a master's script calls, of k calls that took
// took (0: none went), and sends what queued meanwhile if there is room
// now, and what other masters held back for company. Each ends when all
// its callers have stopped waiting, so a dead master costs a caller its
// own budget only.
func (b *batcher) masterDone(addr string, k int, took time.Duration) {
	b.mu.Lock()
	q := b.masters[addr]
	q.inflight--
	b.callers -= k
	if took > 0 {
		q.rtt += (int64(took) - q.rtt) / 8
	}
	b.sendQueued(addr, q)
	for a, m := range b.masters {
		if m.lingering {
			b.sendQueued(a, m)
		}
	}
	b.mu.Unlock()
}

// maxLinger bounds how long a master's calls wait for company (see
// lingerFor).
const maxLinger = time.Millisecond

// lingerFor returns how long calls that queue for a master with
// nothing in flight may wait for company, given (see masterQueue) large,
// masters, the calls in all the masters' queues and script calls
// (callers), how many of those are queued for this master (pending),
// the masters' script calls in flight (out), and this master's round
// trip (rtt, ns): 0, to go now, unless the master's batches are large,
// there are other masters and their script calls keep the CPU busy, and
// fewer than this master's share of the callers are queued for it
// (callers/masters, maxBatch at most); then two round trips, and
// maxLinger at most.
//
// Why: each script call costs Redis and the client as much as a few
// decisions. On a Cluster the callers spread over the masters, each with
// its own call in flight, so that with many masters each one's callers
// are few, and split between its call in flight and its queue: its
// calls carry a fraction of what a standalone server's do. While other
// masters' calls run and batches are large, the CPU that Redis and the
// client share is the bottleneck, and a master that waits a little for
// its share of the callers decides more with less of it. The wait
// scales with the round trip, so that a master that answers quickly
// waits little, and a master that hangs holds up only its own calls,
// and the others' by maxLinger at most. Guarded by bench's redisbench
// -cluster.
func lingerFor(large bool, masters, callers, pending, out int, maxBatch int, rtt int64) time.Duration {
	if !large || masters < 2 || out == 0 || pending >= min(callers/masters, maxBatch) {
		return 0
	}
	return min(2*time.Duration(rtt), maxLinger)
}

// linger reports whether q's pending calls wait for company (see
// lingerFor) with nothing in flight to q's master, and arms q's timer to
// send them when their wait ends. b.mu is held.
func (b *batcher) linger(addr string, q *masterQueue) bool {
	q.lingering = false
	if q.inflight > 0 || !q.large {
		return false
	}
	out := 0 // the other masters' script calls in flight
	for _, m := range b.masters {
		out += m.inflight
	}
	wait := lingerFor(q.large, len(b.masters), b.callers, len(q.pending), out, b.maxBatch, q.rtt) - time.Since(q.since)
	if wait <= 0 {
		return false
	}
	q.lingering = true
	if q.timer == nil {
		q.timer = time.AfterFunc(wait, func() {
			b.mu.Lock()
			q.timer = nil
			if !b.closed {
				b.sendQueued(addr, q)
			}
			b.mu.Unlock()
		})
	}
	return true
}

// finished records the end of a script call of k calls whose callers
// waited wait (ns) in all (for adapt), and wakes a worker if calls are
// waiting.
func (b *batcher) finished(k int, wait int64) {
	b.mu.Lock()
	b.inflight--
	b.adapt(k, wait)
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
			k, work, full := b.next()
			if k == 0 || !b.room(full) {
				b.mu.Unlock()
				break
			}
			b.work -= work
			batch = append(batch[:0], b.pending[:k]...)
			rest := copy(b.pending, b.pending[k:])
			clear(b.pending[rest:])
			b.pending = b.pending[:rest]
			b.out(k)
			b.mu.Unlock()
			if rest > 0 {
				b.signal() // another worker can take the rest
			}
			// The waits so far, read before send releases the calls to
			// their callers, who may reuse them.
			start := b.now()
			var wait int64
			for _, c := range batch {
				wait += int64(start.Sub(c.asked))
			}
			ctx, cancel := context.WithTimeout(context.Background(), b.timeout)
			b.s.send(ctx, batch)
			cancel()
			b.finished(k, wait+int64(k)*int64(b.now().Sub(start)))
		}
	}
}

// callersContext returns a context that ends after timeout, or as soon as
// every one of calls' callers has stopped waiting.
func callersContext(calls []*call, timeout time.Duration) (context.Context, context.CancelFunc) {
	return untilAbandoned(time.Now().Add(timeout), len(calls), func(i int) context.Context { return calls[i].ctx })
}

// untilAbandoned returns a context that ends at deadline, or as soon as
// every one of the n contexts that caller(i) gives has ended: what a
// batch goes on for while anyone waits for it.
func untilAbandoned(deadline time.Time, n int, caller func(i int) context.Context) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithDeadline(context.Background(), deadline)
	var left atomic.Int64
	left.Store(int64(n))
	stops := make([]func() bool, n)
	for i := range n {
		stops[i] = context.AfterFunc(caller(i), func() {
			if left.Add(-1) == 0 {
				cancel()
			}
		})
	}
	return ctx, func() {
		for _, stop := range stops {
			stop()
		}
		cancel()
	}
}

// send runs calls in as few script calls as the Cluster's slots allow,
// and sets every call's result. ctx bounds the script calls. Each group's
// callers are released as soon as their own script call returns, so that
// a slow or dead Cluster master holds up only the calls for its slots.
func (s *Store) send(ctx context.Context, calls []*call) {
	groups := [][]*call{calls}
	if s.cluster {
		groups = groupBySlot(calls)
	}
	s.sendGroups(ctx, groups)
}

// sendGroups runs each of groups, whose keys share a slot, in a script
// call of its own, side by side, and wakes each group's callers as soon as
// its own script call returns.
func (s *Store) sendGroups(ctx context.Context, groups [][]*call) {
	if len(groups) == 1 {
		s.sendGroup(ctx, groups[0])
		release(groups[0])
		return
	}
	var wg sync.WaitGroup
	for _, g := range groups {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s.sendGroup(ctx, g)
			release(g)
		}()
	}
	wg.Wait()
}

// release wakes the callers waiting for calls.
func release(calls []*call) {
	for _, c := range calls {
		if c.queued {
			c.ready <- struct{}{} // never blocks: one value, and room for one
		}
	}
}
