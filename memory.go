package floodgate

import (
	"context"
	"hash/maphash"
	"math/bits"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/floodgate/floodgate/core"
)

// MemoryOptions configures NewMemoryStore. The zero value (or nil) gives the
// defaults.
type MemoryOptions struct {
	// Clock is the store's time source. Default: SystemClock().
	Clock Clock
	// MaxKeys bounds how many keys the store holds, so that a flood of
	// distinct keys cannot exhaust memory. Default: 1,048,576 (a key of a
	// single-limit token bucket costs about 200 bytes with a short key).
	//
	// A new key that finds its shard full first evicts keys that are back
	// to full, which loses nothing. When none is, it evicts the key that
	// will be back to full soonest among a sample of 16: that key may then
	// admit up to its remaining deficit early. Evictions counts these.
	MaxKeys int
	// Shards is the number of independently locked parts of the store, so
	// that unrelated keys do not contend. Default: 64; rounded up to a
	// power of two.
	Shards int
	// SweepInterval is how often a background goroutine removes the keys
	// that are back to full. Default: one minute. A negative value turns the
	// goroutine off; keys are then removed only when their shard needs room
	// or Sweep is called.
	SweepInterval time.Duration
}

// MemoryStore is the embedded in-memory Store, floodgate's default. It
// keeps state in process memory, so it limits one process; use the Redis
// store to share limits between processes.
//
// A MemoryStore is safe for concurrent use. Deciding a request on a key it
// already holds does not allocate (except for a sliding log that needs a
// larger buffer). Keys are removed once every limit on them is back to
// full: their absence means the same thing.
type MemoryStore struct {
	clock       Clock
	sys         *systemClock // clock, when it is the system clock
	seed        maphash.Seed
	shards      []memShard
	mask        uint64
	maxPerShard int
	evictions   atomic.Uint64

	closed    atomic.Bool
	closeOnce sync.Once
	stop      chan struct{}
	done      chan struct{}
}

var _ Store = (*MemoryStore)(nil)

type memShard struct {
	mu sync.Mutex
	m  map[string]*memEntry
	// last is the entry of lastKey, the key this shard found last: a hot
	// key skips the map lookup (and its second hash of the key). It is
	// cleared whenever lastKey leaves the map.
	last    *memEntry
	lastKey string
	_       [16]byte // keeps neighbouring shards' locks off one cache line
}

// get returns key's entry, or nil. The shard is locked.
func (sh *memShard) get(key string) *memEntry {
	if sh.last != nil && sh.lastKey == key {
		return sh.last
	}
	e := sh.m[key]
	if e != nil {
		sh.last, sh.lastKey = e, key
	}
	return e
}

// remove deletes key. The shard is locked.
func (sh *memShard) remove(key string) {
	if sh.last != nil && sh.lastKey == key {
		sh.last, sh.lastKey = nil, ""
	}
	delete(sh.m, key)
}

type memEntry struct {
	full   int64 // µs: when every limit on the key is back to full
	states []core.State
}

// evictSample is how many keys a full shard looks at to choose one to
// evict.
const evictSample = 16

// NewMemoryStore returns a new in-memory store configured by opts (nil for
// the defaults). Close it to stop its background sweeper.
func NewMemoryStore(opts *MemoryOptions) *MemoryStore {
	var c MemoryOptions
	if opts != nil {
		c = *opts
	}
	if c.Clock == nil {
		c.Clock = SystemClock()
	}
	if c.MaxKeys <= 0 {
		c.MaxKeys = 1 << 20
	}
	if c.Shards <= 0 {
		c.Shards = 64
	}
	if c.Shards > c.MaxKeys {
		c.Shards = c.MaxKeys
	}
	if c.SweepInterval == 0 {
		c.SweepInterval = time.Minute
	}
	n := 1 << bits.Len(uint(c.Shards-1))
	sys, _ := c.Clock.(*systemClock)
	s := &MemoryStore{
		sys:         sys,
		clock:       c.Clock,
		seed:        maphash.MakeSeed(),
		shards:      make([]memShard, n),
		mask:        uint64(n - 1),
		maxPerShard: max(1, c.MaxKeys/n),
		stop:        make(chan struct{}),
		done:        make(chan struct{}),
	}
	for i := range s.shards {
		s.shards[i].m = make(map[string]*memEntry)
	}
	if c.SweepInterval > 0 {
		go s.sweeper(c.SweepInterval)
	} else {
		close(s.done)
	}
	return s
}

// Prepare implements Store.
func (s *MemoryStore) Prepare(limits []core.Spec) (core.Policy, error) {
	if err := core.CheckSpecs(limits); err != nil {
		return nil, err
	}
	if s.closed.Load() {
		return nil, ErrClosed
	}
	return &memPolicy{s: s, specs: slices.Clone(limits)}, nil
}

// memPolicy is the memory store's Policy.
type memPolicy struct {
	s     *MemoryStore
	specs []core.Spec
}

// Take implements core.Policy.
func (p *memPolicy) Take(ctx context.Context, key string, n int64) (core.Decision, error) {
	v, i, err := p.decide(ctx, key, n)
	return core.Decision{Verdict: v, Index: i}, err
}

// decide is Take without the Decision around its verdict and index, so
// that a Limiter on the memory store calls it directly (see
// Limiter.AllowN): on the hot path of the default store, the interface
// call and the copies through a Decision are a tenth of a decision.
func (p *memPolicy) decide(ctx context.Context, key string, n int64) (core.Verdict, int, error) {
	// The checks are spelled out inline for the hot path; the core's
	// checks run only to say what is wrong.
	if key == "" || len(key) > MaxKeyLen || n < 0 {
		return core.Verdict{}, 0, core.CheckRequest(key, n)
	}
	s := p.s
	if s.closed.Load() {
		return core.Verdict{}, 0, ErrClosed
	}
	if err := ctx.Err(); err != nil {
		return core.Verdict{}, 0, err
	}
	now := s.now()
	if len(p.specs) == 1 {
		return s.takeOne(key, &p.specs[0], now, n), 0, nil
	}
	var vs [MaxLimits]core.Verdict
	var next [MaxLimits]core.Delta

	sh := &s.shards[maphash.String(s.seed, key)&s.mask]
	sh.mu.Lock()
	e := sh.get(key)
	if e != nil && len(e.states) != len(p.specs) {
		e.resize(len(p.specs))
	}
	allowed := true
	for i := range p.specs {
		var st *core.State
		var zero core.State
		if e != nil {
			st = &e.states[i]
			if st.Kind != p.specs[i].Kind {
				*st = core.State{}
			}
		} else {
			st = &zero
		}
		vs[i], next[i] = p.specs[i].Step(st, now, n)
		allowed = allowed && vs[i].Allowed
	}
	charged := allowed && n > 0
	if e == nil && charged {
		e = &memEntry{states: make([]core.State, len(p.specs))}
		s.insert(sh, key, e, now)
	}
	if e != nil {
		var full int64
		for i := range p.specs {
			core.Commit(&e.states[i], next[i], n, charged)
			full = max(full, vs[i].Reset)
		}
		e.full = now + full
	}
	sh.mu.Unlock()
	d := core.Decide(vs[:len(p.specs)])
	return d.Verdict, d.Index, nil
}

// Reset implements Policy: it forgets key.
func (p *memPolicy) Reset(ctx context.Context, key string) error {
	if err := core.CheckKey(key); err != nil {
		return err
	}
	s := p.s
	if s.closed.Load() {
		return ErrClosed
	}
	sh := &s.shards[maphash.String(s.seed, key)&s.mask]
	sh.mu.Lock()
	sh.remove(key)
	sh.mu.Unlock()
	return nil
}

// now reads the store's clock in microseconds.
func (s *MemoryStore) now() int64 {
	if s.sys != nil {
		return s.sys.micros()
	}
	return s.clock.Now().UnixMicro()
}

// takeOne decides a key with one limit: the common case, without the
// arrays that several limits need.
func (s *MemoryStore) takeOne(key string, l *core.Spec, now, n int64) core.Verdict {
	sh := &s.shards[maphash.String(s.seed, key)&s.mask]
	sh.mu.Lock()
	e := sh.get(key)
	var st *core.State
	var zero core.State
	if e != nil {
		if len(e.states) != 1 {
			e.resize(1)
		}
		st = &e.states[0]
		if st.Kind != l.Kind {
			*st = core.State{}
		}
	} else {
		st = &zero
	}
	v, next := l.Step(st, now, n)
	charged := v.Allowed && n > 0
	if e == nil && charged {
		e = &memEntry{states: make([]core.State, 1)}
		s.insert(sh, key, e, now)
	}
	if e != nil {
		core.Commit(&e.states[0], next, n, charged)
		e.full = now + v.Reset
	}
	sh.mu.Unlock()
	return v
}

func (e *memEntry) resize(n int) {
	states := make([]core.State, n)
	copy(states, e.states)
	e.states = states
}

// insert adds e under key to sh, which is locked, making room first if the
// shard is full.
func (s *MemoryStore) insert(sh *memShard, key string, e *memEntry, now int64) {
	if len(sh.m) >= s.maxPerShard {
		var victim string
		var victimFull int64
		freed, seen := false, 0
		for k, v := range sh.m {
			if v.full <= now {
				sh.remove(k)
				freed = true
			} else if victim == "" || v.full < victimFull {
				victim, victimFull = k, v.full
			}
			if seen++; seen == evictSample {
				break
			}
		}
		if !freed && victim != "" {
			sh.remove(victim)
			s.evictions.Add(1)
		}
	}
	sh.m[key] = e
	sh.last, sh.lastKey = e, key
}

// Sweep removes every key that is back to full and returns how many it
// removed. The background sweeper calls it every SweepInterval.
func (s *MemoryStore) Sweep() int {
	now := s.now()
	removed := 0
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.Lock()
		for k, e := range sh.m {
			if e.full <= now {
				sh.remove(k)
				removed++
			}
		}
		sh.mu.Unlock()
	}
	return removed
}

// Len returns how many keys the store holds.
func (s *MemoryStore) Len() int {
	n := 0
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.Lock()
		n += len(sh.m)
		sh.mu.Unlock()
	}
	return n
}

// Evictions returns how many keys were evicted before they were back to
// full, because the store held MaxKeys keys.
func (s *MemoryStore) Evictions() uint64 { return s.evictions.Load() }

func (s *MemoryStore) sweeper(every time.Duration) {
	defer close(s.done)
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-s.stop:
			return
		case <-t.C:
			s.Sweep()
		}
	}
}

// Close stops the background sweeper and makes further calls fail with
// ErrClosed. It is safe to call more than once.
func (s *MemoryStore) Close() error {
	s.closeOnce.Do(func() {
		s.closed.Store(true)
		close(s.stop)
	})
	<-s.done
	return nil
}
