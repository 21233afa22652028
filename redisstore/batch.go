package redisstore

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/floodgate/floodgate"
)

// This file batches concurrent decisions. script.go sends a batch as one
// call of decide.lua; fastpath.go sends lone bucket decisions through the
// function library; slots.go groups a batch by Cluster slot.

// call is one decision on its way to Redis: its keys and its part of the
// script's arguments, and, once done, its result.
type call struct {
	ctx   context.Context // the caller's, for a call sent on its own
	p     *policy
	keys  []string
	n     int64
	now   int64        // µs, or -1 for the server's TIME
	specs []scriptSpec // per limit, its parameters (p.params, or the calendar's)
	slot  int          // the Cluster slot of its keys; 0 outside a cluster

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
