// Package redisstore is a floodgate.Store on Redis, so that many processes
// share one limit. Every decision is one atomic Lua script, run with
// EVALSHA (and reloaded transparently after SCRIPT FLUSH, a restart or a
// failover), timed by the Redis server's clock so that the application
// servers' clocks do not matter. On Redis 7 and later the scripts run as
// the functions of a Redis function library (FCALL) instead, which costs
// Redis less; see Options.DisableFunctions.
//
// Prepare (which floodgate.NewLimiter calls once per Limiter) works out
// what every decision on its limits sends: the keys' suffixes, each limit's
// parameters for the scripts, and the fast path's packed argument.
//
// It works with standalone Redis, Sentinel and Redis Cluster: give New any
// redis.UniversalClient. Requires Redis 5 or later (scripts that read TIME
// before writing need effects replication); tested on Redis 7.0 and
// Valkey 8.0.
//
// On a Cluster, the decisions that wait for one master go out together:
// on Redis 7 in one call of a function of the library registered with the
// flag allow-cross-slot-keys, which takes the keys of all the master's
// slots, computed by the client as ever, as arguments rather than
// declared (the one exception to declared keys, see below). The master
// refuses, untouched, a slot that it no longer serves or is migrating;
// those requests go again, once, to the slot's owner. Where a Cluster
// lacks functions, decisions are batched per slot, and Options.Logger
// says so once.
//
// # Keys
//
// Each limit on a key is one Redis key, <prefix>{<key>}:<index><kind>,
// where kind is b (token bucket, leaky bucket, GCRA), f (fixed window),
// s (sliding window counter) or l (sliding log). A key containing { or }
// is tagged by a hash of it instead: <prefix>{<hash>}<key>:<index><kind>.
// All the keys of one decision share the hash tag, so they live in one
// Cluster slot. The first three kinds are strings (binary for b and f); the
// sliding log is a sorted set with one member per admitted unit, never
// more than the limit. Every key expires when its limit is back to full,
// so an idle key costs nothing, and a missing key means "full".
//
// A key's override is <prefix>{<key>}:o beside them. Every key a script
// names is one the client declares in KEYS, derived ones included (the
// override key, an override's limits' keys), as the scripting contract,
// an ACL's key patterns and Dragonfly (by default) want, but for a
// Cluster's call across slots, which passes the same keys as arguments
// (Redis refuses declared keys of several slots); the scripts run
// unchanged on Lua 5.1 (Redis, Valkey) and 5.4 (Dragonfly).
package redisstore

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"log/slog"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/floodgate/floodgate"
	"github.com/floodgate/floodgate/core"
	"github.com/floodgate/floodgate/internal/lib/storekit"
	"github.com/redis/go-redis/v9"
)

// Options configures a Store. The zero value (or nil) gives the defaults.
// docs/redis.md describes each option at length.
type Options struct {
	// Prefix is prepended to every Redis key. Default: "floodgate:".
	Prefix string
	// Clock, when set, replaces the Redis server's TIME as the source of
	// time (the conformance tests use it). Redis's expiry clock does not
	// follow it, so keys are then kept ten minutes longer. Default: nil,
	// server time.
	Clock floodgate.Clock
	// DisableBatching sends every decision in a script call of its own.
	// By default decisions made while others are in flight go together in
	// one script call; a decision that finds nothing in flight goes at
	// once. Results are the same either way. Default: false.
	DisableBatching bool
	// MaxInflight is the most script calls in flight at once on a
	// standalone server. While calls carry 4 requests or more, 3 go out
	// (a busy Redis does best with the fewest, largest batches); below
	// that the number moves between 2 and MaxInflight to where callers
	// wait least. On a Cluster each master has up to two script calls in
	// flight instead, and while they carry 4 requests or more the masters
	// share 3 (at least one each). Default: 8.
	MaxInflight int
	// MaxBatch is the most decisions in one script call. Default: 128.
	//
	// A batch also closes when its sliding logs' work reaches a budget of
	// four times MaxLogQuota members written (a member expired or
	// refunded counting an eighth), worked out from each request's limits
	// and cost, so that no script call holds Redis for more than a few
	// milliseconds; a request that does not fit goes first in the next
	// batch. A request alone always goes. Requests without a sliding log
	// add nothing to it. A key's override is not known before its script
	// runs, so requests whose overrides make sliding logs of other limits
	// count as their own limits do: their batch is bounded by MaxBatch
	// requests' work, as without the budget.
	MaxBatch int
	// DenialCache answers locally a request that Redis denied a moment ago
	// (same key, limits and cost) until the retry-after Redis gave, with
	// Source floodgate.SourceCache: exactly Redis's answer, since a refund,
	// an override or a reset in any process lifts it everywhere through
	// the channel floodgate:lifts (waiting at most LiftWait). Not for the
	// sliding window counter, peeks or forced charges. Default: false.
	DenialCache bool
	// Leases lets a process admit requests on a hot key of a lone bucket
	// limit from units it took from Redis ahead, with Source
	// floodgate.SourceLease; leases never over-admit, and delay other
	// processes on the key by at most a lease's units and time. A reset or
	// an override ends them everywhere. Default: nil, no leases.
	Leases *LeaseOptions
	// DisableFunctions calls the scripts with EVALSHA even on Redis 7,
	// where by default they are a function library (floodgate_<hash>)
	// called with FCALL, which costs Redis less. The Store falls back to
	// EVALSHA by itself where functions are missing or an ACL refuses
	// them. Default: false.
	DisableFunctions bool
	// Logger receives the Store's rare notices, such as a Redis Cluster
	// that cannot batch across slots (see docs/redis.md). Default:
	// slog.Default().
	Logger *slog.Logger
}

// Store is a floodgate.Store on Redis. It is safe for concurrent use.
type Store struct {
	client   redis.UniversalClient
	cluster  bool
	resends  resends // how run sends again a call that did not run
	prefix   string
	clock    floodgate.Clock
	extraTTL int64 // ms added to every expiry
	owned    bool
	batch    *batcher  // nil when batching is off
	calls    sync.Pool // of *call, for takeRedis (see get)
	denials  *denials  // nil when the denial cache is off
	leases   *leases   // nil without leases
	// With the denial cache, the listener of the lifts (lifts.go): closed
	// by Close, which waits for liftsDone.
	liftsStop, liftsDone chan struct{}
	// noFastPath sends lone bucket decisions through decide.lua too; the
	// tests set it to check that both scripts decide alike.
	noFastPath bool
	// noFunctions is set when functions are disabled, missing or refused:
	// the fast path then runs with EVALSHA.
	noFunctions atomic.Bool
	closed      atomic.Bool
	// calClock places calendar windows when the time is Redis's: the
	// client works out the window that contains its now.
	calClock floodgate.Clock
	// decoded caches the overrides that replies carried.
	decoded overrideCache
	// foreign holds the keys whose override the fast path cannot decide.
	foreign foreignKeys
	// cause is the client's last error since a success (see Cause).
	cause atomic.Pointer[error]
	// scripts are the Lua the Store runs: the package's scripts, or in
	// tests a checked assembly of them.
	scripts *scriptSet
	// overrideKeys holds the keys of overrides' limits that requests
	// declare besides their Policy's.
	overrideKeys overrideKeys
	// argKeys sends the buckets' and decide.lua's calls to the functions
	// that take their keys as arguments (argKeysArgs); the tests set it.
	argKeys bool
	// traced is set once a call was traced (trace.go).
	traced atomic.Bool
	// slotBatch queues the concurrency limits' operations (concurrency.go).
	slotBatch slotBatcher
	// cross is a Cluster's batching across slots (cross.go).
	cross  crossState
	logger *slog.Logger
}

var _ floodgate.Store = (*Store)(nil)

// injectedClockTTL is how long keys outlive their reset when the time comes
// from an injected clock rather than from Redis.
const injectedClockTTL = 10 * time.Minute

// New returns a Store on client, which may be a standalone, Sentinel
// (failover) or Cluster client. Unless batching is disabled it starts
// MaxInflight goroutines that Close stops; closing the Store does not
// close client. It adds a hook to client that keeps its last error for
// Cause.
//
// Build the client with ContextTimeoutEnabled: true, so that a context's
// deadline bounds the wait for a reply; without it go-redis waits up to
// its ReadTimeout (3s by default) for a server that hangs, whatever the
// context says.
func New(client redis.UniversalClient, opts *Options) *Store {
	var o Options
	if opts != nil {
		o = *opts
	}
	if o.Prefix == "" {
		o.Prefix = "floodgate:"
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	s := &Store{client: client, prefix: o.Prefix, clock: o.Clock, calClock: o.Clock, scripts: scripts, logger: o.Logger}
	if s.calClock == nil {
		s.calClock = floodgate.SystemClock()
	}
	s.noFunctions.Store(o.DisableFunctions)
	_, s.cluster = client.(*redis.ClusterClient)
	s.resends = resendsOf(client)
	s.watch(client)
	if o.Clock != nil {
		s.extraTTL = injectedClockTTL.Milliseconds()
	}
	now := time.Now
	if o.Clock != nil {
		now = o.Clock.Now
	}
	if o.DenialCache {
		s.denials = newDenials(now)
	}
	if o.Leases != nil {
		s.leases = newLeases(s, *o.Leases, now)
	}
	if o.DenialCache || o.Leases != nil {
		s.liftsStop, s.liftsDone = make(chan struct{}), make(chan struct{})
		go s.listenLifts(client.Subscribe(context.Background(), liftsChannel), s.liftsStop, s.liftsDone)
	}
	if !o.DisableBatching {
		if o.MaxInflight <= 0 {
			o.MaxInflight = 8
		}
		if o.MaxBatch <= 0 {
			o.MaxBatch = 128
		}
		s.batch = newBatcher(s, o.MaxInflight, o.MaxBatch, batchTimeout, now)
	}
	return s
}

// batchTimeout bounds a batch's script call. Each caller waits no longer
// than its own context allows.
const batchTimeout = 5 * time.Second

// NewFromURL returns a Store on a new client for url (see NewClient),
// which Close closes.
func NewFromURL(url string, opts *Options) (*Store, error) {
	client, err := NewClient(url)
	if err != nil {
		return nil, err
	}
	s := New(client, opts)
	s.owned = true
	return s, nil
}

// NewClient returns a go-redis client for url:
//
//   - redis://[user:password@]host:port[/db], or rediss:// for TLS: one
//     server, with go-redis's query options (dial_timeout, pool_size, ...);
//   - redis+sentinel://[sentinel-user:sentinel-password@]host:port[/db]?master_name=NAME[&addr=host2:port2...],
//     or rediss+sentinel://: the master that the Sentinels at host:port and
//     every addr name, found again after a failover. The master's own
//     credentials are the query options username and password;
//   - redis+cluster://[user:password@]host:port[?addr=host2:port2...], or
//     rediss+cluster://: a Redis Cluster, found from host:port and every
//     addr.
//
// Every client it returns bounds its waits by the context's deadline
// (ContextTimeoutEnabled), so that a hung server costs a caller no more
// than its context allows (see package fallback), and closes a
// connection idle for 4 minutes unless the URL's conn_max_idle_time says
// otherwise (see docs/redis.md).
func NewClient(url string) (redis.UniversalClient, error) { return NewClientDialer(url, nil) }

// idleConnTimeout is how long a connection of NewClient's clients may sit
// idle in their pool: less than the idle timeouts of common load
// balancers and managed Redis services. A connection that one of them
// closed while idle fails the first script call sent on it where go-redis
// does not see the close first (over TLS, or through a balancer that
// drops the flow), since the store does not send a call again that may
// have run (see docs/redis.md).
const idleConnTimeout = 4 * time.Minute

// Dialer opens a connection to a Redis server at addr; its signature is
// go-redis's Options.Dialer's.
type Dialer func(ctx context.Context, network, addr string) (net.Conn, error)

// NewClientDialer is NewClient with dial, when not nil, making every
// connection of the client: to the server, to every Sentinel and master,
// to every Cluster node. A dialer that speaks TLS makes the client speak
// TLS whatever the URL's scheme; floodgate serve's --redis-tls-* flags
// give one that presents a client certificate reloaded on SIGHUP.
func NewClientDialer(url string, dial Dialer) (redis.UniversalClient, error) {
	for _, scheme := range []string{"redis", "rediss"} {
		if rest, ok := strings.CutPrefix(url, scheme+"+cluster://"); ok {
			o, err := redis.ParseClusterURL(scheme + "://" + rest)
			if err != nil {
				return nil, fmt.Errorf("redisstore: cluster URL: %w", err)
			}
			o.ContextTimeoutEnabled = true
			o.ConnMaxIdleTime = idleTimeout(o.ConnMaxIdleTime)
			if dial != nil {
				o.Dialer = dial
			}
			return redis.NewClusterClient(o), nil
		}
	}
	if rest, ok := strings.CutPrefix(url, "redis+sentinel://"); ok {
		return failoverClient("redis://"+rest, dial)
	}
	if rest, ok := strings.CutPrefix(url, "rediss+sentinel://"); ok {
		return failoverClient("rediss://"+rest, dial)
	}
	o, err := redis.ParseURL(url)
	if err != nil {
		return nil, fmt.Errorf("redisstore: %w", err)
	}
	o.ContextTimeoutEnabled = true
	o.ConnMaxIdleTime = idleTimeout(o.ConnMaxIdleTime)
	if dial != nil {
		o.Dialer = dial
	}
	return redis.NewClient(o), nil
}

// idleTimeout returns d, a URL's conn_max_idle_time, or idleConnTimeout
// when the URL set none.
func idleTimeout(d time.Duration) time.Duration {
	if d == 0 {
		return idleConnTimeout
	}
	return d
}

func failoverClient(url string, dial Dialer) (redis.UniversalClient, error) {
	o, err := redis.ParseFailoverURL(url)
	if err != nil {
		return nil, fmt.Errorf("redisstore: sentinel URL: %w", err)
	}
	if o.MasterName == "" {
		return nil, errors.New("redisstore: a sentinel URL needs master_name=<the monitored master's name>")
	}
	o.ContextTimeoutEnabled = true
	o.ConnMaxIdleTime = idleTimeout(o.ConnMaxIdleTime)
	if dial != nil {
		// go-redis dials the Sentinels and the master with it.
		o.Dialer = dial
	}
	return redis.NewFailoverClient(o), nil
}

// Prepare implements floodgate.Store. It works out once what every
// decision on these limits sends to Redis: the keys' suffixes, each
// limit's parameters for the scripts, and whether the fast path decides.
func (s *Store) Prepare(limits []core.Spec) (core.Policy, error) {
	if err := storekit.CheckSpecs(limits); err != nil {
		return nil, err
	}
	if s.closed.Load() {
		return nil, floodgate.ErrClosed
	}
	p := &policy{s: s, specs: slices.Clone(limits), suffixes: make([]string, len(limits)), params: make([]scriptSpec, len(limits))}
	for i := range p.specs {
		sp := &p.specs[i]
		p.suffixes[i] = strconv.Itoa(i) + string(suffixOf(sp.Kind))
		p.params[i] = newScriptSpec(sp)
		if sp.Calendar != 0 {
			p.calendar = true
		}
		if sp.Kind == core.Log {
			p.logs++
			p.logQuota += sp.Quota
		}
	}
	if len(p.specs) == 1 && p.specs[0].Kind == core.Bucket {
		p.fast = newFastArgs(&p.specs[0], s.extraTTL)
		if s.leases != nil {
			p.leaseK = s.leases.opts.leaseSize(&p.specs[0])
		}
	}
	if len(p.specs) == 1 && p.specs[0].Kind == core.Fixed && p.specs[0].Calendar == 0 {
		p.fast = newFastArgs(&p.specs[0], s.extraTTL)
	}
	return p, nil
}

// suffixOf returns the letter that ends the Redis key of a limit of kind
// k.
func suffixOf(k core.Kind) byte {
	switch k {
	case core.Fixed:
		return 'f'
	case core.Sliding:
		return 's'
	case core.Log:
		return 'l'
	}
	return 'b'
}

// Partitioned implements core.Partitioner: it reports whether the Store
// is on a Redis Cluster.
func (s *Store) Partitioned() bool { return s.cluster }

// Partition implements core.Partitioner: on a Redis Cluster, the address
// of the master that holds key's state, as the client's view of the
// cluster has it; "" elsewhere, or before that view is known.
func (s *Store) Partition(key string) string {
	cc, ok := s.client.(*redis.ClusterClient)
	if !ok {
		return ""
	}
	node, err := cc.MasterForKey(context.Background(), hashTag(key))
	if err != nil {
		return ""
	}
	return node.Options().Addr
}

// policy is the Store's core.Policy: limits prepared for Redis.
type policy struct {
	s        *Store
	specs    []core.Spec
	suffixes []string     // per limit: the end of its Redis key, "0b"
	params   []scriptSpec // per limit: its parameters for decide.lua
	calendar bool         // a limit is a calendar window: params vary with the time
	fast     *fastArgs    // a lone bucket or fixed (not calendar) window: the fast path's arguments; nil otherwise
	leaseK   int64        // with leases, a lone bucket's lease size; 0 without
	// The sliding logs among the limits: how many, and their quotas added
	// up (at most core.MaxLogQuota), for the batcher's bound on a script
	// call's log work (see logWork); 0 and 0 without one.
	logs, logQuota int64
}

// keys returns the Redis keys of key's limits.
func (p *policy) keys(key string) []string {
	return p.appendKeys(make([]string, 0, len(p.suffixes)+1), key, false)
}

// appendKeys appends the Redis keys of key's limits to dst, then with
// override key's override key, and returns the extended slice. The keys
// are parts of one string, built at its exact size: one allocation for
// them all, and none for dst when it has room.
func (p *policy) appendKeys(dst []string, key string, override bool) []string {
	// head is "<prefix>{key}:", or for a key with braces of its own
	// "<prefix>{hash}key:" (see hashTag).
	head := len(p.s.prefix) + len(key) + 3
	tag, braces := "", strings.ContainsAny(key, "{}")
	if braces {
		tag = hashTag(key)
		head = len(p.s.prefix) + len(tag) + len(key) + 1
	}
	size := 0
	for _, suffix := range p.suffixes {
		size += head + len(suffix)
	}
	if override {
		size += head + 1
	}
	var b strings.Builder
	b.Grow(size)
	writeKey := func(suffix string) {
		b.WriteString(p.s.prefix)
		if !braces {
			b.WriteByte('{')
			b.WriteString(key)
			b.WriteByte('}')
		} else {
			b.WriteString(tag)
			b.WriteString(key)
		}
		b.WriteByte(':')
		b.WriteString(suffix)
	}
	for _, suffix := range p.suffixes {
		writeKey(suffix)
	}
	if override {
		writeKey("o")
	}
	all, at := b.String(), 0
	for _, suffix := range p.suffixes {
		dst = append(dst, all[at:at+head+len(suffix)])
		at += head + len(suffix)
	}
	if override {
		dst = append(dst, all[at:])
	}
	return dst
}

// hashTag returns the Cluster hash tag of key's Redis keys: "{key}", or,
// for a key with braces of its own, "{" + a hash of it + "}".
func hashTag(key string) string {
	if !strings.ContainsAny(key, "{}") {
		return "{" + key + "}"
	}
	h := fnv.New64a()
	h.Write([]byte(key))
	return "{" + strconv.FormatUint(h.Sum64(), 36) + "}"
}

// Take implements core.Policy.
func (p *policy) Take(ctx context.Context, key string, n int64) (core.Decision, error) {
	return p.take(ctx, key, n, opTake)
}

// Charge implements core.Policy.Charge, in the same one script call per
// decision as Take.
func (p *policy) Charge(ctx context.Context, key string, n int64) (core.Decision, error) {
	return p.take(ctx, key, n, opCharge)
}

// Refund implements core.Policy.Refund, in the same one script call per
// decision as Take. It lifts the key's cached denial.
func (p *policy) Refund(ctx context.Context, key string, n int64) (core.Decision, error) {
	return p.take(ctx, key, n, opRefund)
}

func (p *policy) take(ctx context.Context, key string, n int64, o op) (core.Decision, error) {
	if err := storekit.CheckRequest(key, n); err != nil {
		return core.Decision{}, err
	}
	s := p.s
	if s.closed.Load() {
		return core.Decision{}, floodgate.ErrClosed
	}
	if p.leaseK > 0 && o == opTake && n > 0 && n <= p.leaseK {
		d, ok, err := s.leases.take(ctx, p, key, n)
		if err != nil {
			return core.Decision{}, s.wrap(ctx, err)
		}
		if ok {
			return d, nil
		}
	}
	return p.takeRedis(ctx, key, n, o)
}

// takeRedis is take, decided by Redis.
func (p *policy) takeRedis(ctx context.Context, key string, n int64, o op) (core.Decision, error) {
	s := p.s
	var sent time.Time
	if s.denials != nil && o == opTake {
		if d, ok := s.denials.get(key, p, n); ok {
			return d, nil
		}
		sent = s.denials.now()
	}
	c := s.get()
	defer s.put(c)
	ctx, span := s.startSpan(ctx)
	p.fill(c, ctx, key, n, s.nowArg(), o)
	err := s.sendOne(c)
	span.end(err)
	if err != nil {
		return core.Decision{}, err
	}
	d := c.decision()
	if o == opRefund && n > 0 {
		// Other processes' denial caches drop the key (lifts.go).
		s.lift(ctx, strings.TrimSuffix(c.keys[0], p.suffixes[0]), true)
	}
	if s.denials != nil {
		s.denials.settle(key, p, n, o, sent, d, true)
	}
	return d, nil
}

// fill sets c to do o with n on key under p at now (µs, or -1 for the
// server's TIME): its keys, its limits' parameters, and on a Cluster its
// slot.
func (p *policy) fill(c *call, ctx context.Context, key string, n, now int64, o op) {
	c.ctx, c.p, c.n, c.now, c.specs, c.op = ctx, p, n, now, p.params, o
	p.setKeys(c, key)
	if p.calendar {
		c.specs = p.calendarParams(now)
	}
	if p.s.cluster {
		c.slot = slotOf(c.keys[0])
	}
}

// setKeys sets c's keys for key: its limits' keys, its override key, and
// both as the keys it declares alone.
func (p *policy) setKeys(c *call, key string) {
	c.declared = p.appendKeys(c.kbuf[:0], key, true)
	n := len(c.declared) - 1
	c.keys, c.okey = c.declared[:n:n], c.declared[n]
}

// sendOne sends c, a lone call, in the batcher's next script call when
// the Store batches and on its own otherwise, and returns its error.
func (s *Store) sendOne(c *call) error {
	if s.batch != nil {
		return s.batch.do(c)
	}
	s.send(c.ctx, c.alone())
	return c.err
}

// alone returns a batch of c alone.
func (c *call) alone() []*call {
	c.one[0] = c
	return c.one[:]
}

// decision combines the verdicts of c's limits that the script returned:
// 4 integers each, allowed (1, 0, or 2 for a request that an
// all-or-nothing group undid), remaining, retry and reset.
func (c *call) decision() core.Decision {
	var buf [core.MaxLimits]core.Verdict
	vs := buf[:c.count()]
	undone := false
	for i := range vs {
		v := c.out[4*i:]
		vs[i] = core.Verdict{Allowed: v[0] != 0, Remaining: v[1], Retry: v[2], Reset: v[3]}
		undone = v[0] == 2
	}
	d := core.Decide(vs)
	d.Limits = c.limits
	if undone {
		storekit.Undone(&d)
	}
	return d
}

// count returns how many limits decided c: its override's, or its
// Policy's.
func (c *call) count() int {
	if c.limits != nil {
		return len(c.limits)
	}
	return len(c.specs)
}

// TakeGroup implements core.Store.TakeGroup in one script call: the fast
// path (when every request is on a lone bucket or fixed window) or
// decide.lua decides the requests in order and undoes an all-or-nothing
// group before it returns, so no other client sees its charges. A group of
// one request is decided as that request alone, by the fast path where it
// applies. Each request's Policy must be one that s prepared.
//
// On a Redis Cluster that holds for the requests whose keys share a slot.
// A group whose keys span slots goes out as one script call per slot, side
// by side; when one slot's part denies an all-or-nothing group, the other
// parts are undone by refunds once they return, so that for that moment
// their charges can be seen. Keys that share a hash tag share a slot (see
// the package documentation's Keys).
func (s *Store) TakeGroup(ctx context.Context, reqs []core.Request, all bool) error {
	ctx, span := s.startSpan(ctx)
	err := s.takeGroup(ctx, reqs, all)
	span.end(err)
	return err
}

// takeGroup is TakeGroup, in the span of ctx.
func (s *Store) takeGroup(ctx context.Context, reqs []core.Request, all bool) error {
	if err := storekit.CheckGroup(reqs); err != nil {
		return err
	}
	if s.closed.Load() {
		return floodgate.ErrClosed
	}
	if len(reqs) == 0 {
		return nil
	}
	now := s.nowArg()
	// With the denial cache, a request of a group that is not all or
	// nothing is answered from it as it would be alone, unless a request
	// before it in the group goes to Redis on its key: a cached denial
	// charged nothing, so the requests after it see the same states
	// without it. (In an all-or-nothing group, a denial would undo the
	// others, whose answers then need their states from Redis.)
	var sent time.Time
	cached := s.denials != nil && !all
	if cached {
		sent = s.denials.now()
	}
	// members are the requests sent to Redis; which[j] is members[j]'s
	// index in reqs.
	members, which := make([]*call, 0, len(reqs)), make([]int, 0, len(reqs))
	for i := range reqs {
		r := &reqs[i]
		p, ok := r.Policy.(*policy)
		if !ok || p.s != s {
			return storekit.ForeignPolicy(i, r.Policy)
		}
		o := opTake
		if r.Force {
			o = opCharge
		}
		if cached && o == opTake && !sentBefore(reqs, which, r.Key) {
			if d, ok := s.denials.get(r.Key, p, r.N); ok {
				r.Decision = d
				continue
			}
		}
		m := s.get()
		p.fill(m, ctx, r.Key, r.N, now, o)
		m.advisory = r.Advisory
		members, which = append(members, m), append(which, i)
	}
	if len(members) == 0 {
		return nil // all answered from the denial cache
	}
	// A group of one request is that request alone: all or nothing
	// changes nothing for it, and alone it may take the fast path (an
	// Envoy request of one descriptor, say).
	calls := members
	if len(members) > 1 {
		calls = s.groupCalls(ctx, members, all)
	}
	defer func() {
		if len(calls) == 1 && calls[0].abandoned {
			return // the batch still holds it, and its members
		}
		for _, c := range calls {
			if c.group != nil {
				s.put(c)
			}
		}
		for _, m := range members {
			s.put(m)
		}
	}()
	var err error
	if len(calls) == 1 && s.batch != nil {
		if err = s.batch.do(calls[0]); calls[0].abandoned {
			// The caller stopped waiting: the batch still decides the
			// group and writes its members, so they are not read here.
			for _, i := range which {
				if s.denials != nil && reqs[i].N > 0 {
					s.denials.forget(reqs[i].Key) // its state may move
				}
			}
			return err
		}
	} else {
		s.send(ctx, calls)
		for _, c := range calls {
			if err = c.err; err != nil {
				break
			}
		}
	}
	for j, m := range members {
		i := which[j]
		if m.out != nil {
			reqs[i].Decision = m.decision()
		}
		if s.denials != nil {
			// A denial is cached as a lone one is, in a group whose
			// charges all stay: one that is undone (all or nothing, or a
			// failed part on a Cluster) may have been denied for a charge
			// before it on its key that is given back.
			s.denials.settle(reqs[i].Key, m.p, m.n, m.op, sent, reqs[i].Decision, cached && err == nil && m.out != nil)
		}
	}
	if len(calls) > 1 && (err != nil || (all && storekit.Undo(reqs))) {
		// Undo the parts that charged, slot by slot.
		for j, m := range members {
			i := which[j]
			d := &reqs[i].Decision
			if m.out == nil || !d.Allowed || m.n == 0 {
				continue
			}
			back, rerr := m.p.take(ctx, reqs[i].Key, m.n, opRefund)
			if rerr != nil {
				err = errors.Join(err, rerr)
				continue
			}
			*d = back
			storekit.Undone(d)
		}
	}
	return err
}

// sentBefore reports whether a request of reqs that goes to Redis (which
// indexes them) is on key: the group charges it before a later request on
// key, so a cached denial of key may be out of date by then.
func sentBefore(reqs []core.Request, which []int, key string) bool {
	for _, i := range which {
		if reqs[i].Key == key {
			return true
		}
	}
	return false
}

// groupCalls returns the calls that decide the group of members: one, or
// on a Cluster one per slot that their keys fall in.
func (s *Store) groupCalls(ctx context.Context, members []*call, all bool) []*call {
	parts := [][]*call{members}
	if s.cluster {
		parts = groupBySlot(members)
	}
	calls := make([]*call, len(parts))
	for i, part := range parts {
		c := s.get()
		c.ctx, c.p, c.group, c.all, c.slot = ctx, part[0].p, part, all, part[0].slot
		nk := 0
		for _, m := range part {
			nk += len(m.keys)
		}
		c.keys = make([]string, 0, nk)
		for _, m := range part {
			c.keys = append(c.keys, m.keys...)
		}
		calls[i] = c
	}
	return calls
}

// calendarParams returns the limits' script parameters with the calendar
// windows that contain now (µs, or -1 for the time now), which Lua, with
// no time zones, cannot work out.
func (p *policy) calendarParams(now int64) []scriptSpec {
	if now < 0 {
		now = p.s.calClock.Now().UnixMicro()
	}
	params := slices.Clone(p.params)
	for i := range p.specs {
		if sp := &p.specs[i]; sp.Calendar != 0 {
			start, end := sp.Window(now)
			_, next := sp.Window(end)
			params[i].c0, params[i].c1, params[i].c2 = start, end, next
		}
	}
	return params
}

// Reset implements core.Policy: it deletes key's Redis keys.
func (p *policy) Reset(ctx context.Context, key string) error {
	if err := storekit.CheckKey(key); err != nil {
		return err
	}
	s := p.s
	if s.closed.Load() {
		return floodgate.ErrClosed
	}
	if s.denials != nil {
		s.denials.forget(key)
	}
	if s.leases != nil {
		s.leases.forget(key) // a reset key starts full: no lease survives it
	}
	keys := p.keys(key)
	if err := s.client.Del(ctx, keys...).Err(); err != nil {
		return s.wrap(ctx, err)
	}
	s.lift(ctx, strings.TrimSuffix(keys[0], p.suffixes[0]), false)
	return nil
}

// wrap turns a Redis error into floodgate's: the caller's own cancellation
// or deadline comes back as the context's error; an error about one key
// (see keyFailure) wraps floodgate.ErrKey; everything else wraps
// floodgate.ErrStore. A nil err is nil, so that a success passed by
// mistake is not turned into an error, or a crash.
func (s *Store) wrap(ctx context.Context, err error) error {
	if err == nil {
		return nil
	}
	if ctxErr := ctx.Err(); ctxErr != nil && (errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded)) {
		return ctxErr
	}
	if msg, ok := keyFailure(err.Error()); ok {
		return fmt.Errorf("%w: redis: %s", floodgate.ErrKey, msg)
	}
	if msg, ok := strings.CutPrefix(err.Error(), "FLOODGATE "); ok {
		return fmt.Errorf("%w: redis: %s", floodgate.ErrStore, msg)
	}
	return fmt.Errorf("%w: redis: %w", floodgate.ErrStore, err)
}

// scriptRefusals start the error that the server gives a script whose
// command an ACL refuses (a key or a command the user may not use): Redis
// 7.0's, and Redis 7.2's and Valkey's.
var scriptRefusals = [...]string{"ERR The user executing the script can't", "ERR ACL failure in script: "}

// keyFailure reports whether msg, a Redis reply's error, is about one
// key rather than the server: the scripts' own "FLOODGATE wrong type" and
// "FLOODGATE corrupt state" (the key holds data that is not floodgate's),
// Redis's WRONGTYPE, and an ACL's refusal, NOPERM, which names itself
// whether Redis refused the call or a command in the script. It returns
// the message to report. Connection errors, LOADING, READONLY,
// MASTERDOWN, CLUSTERDOWN, OOM and the rest are the server's, and a
// breaker must hear of them.
func keyFailure(msg string) (string, bool) {
	switch {
	case strings.HasPrefix(msg, "FLOODGATE wrong type"), strings.HasPrefix(msg, "FLOODGATE corrupt state"):
		return msg[len("FLOODGATE "):], true
	case strings.HasPrefix(msg, "WRONGTYPE"), strings.HasPrefix(msg, "NOPERM"):
		return msg, true
	}
	for _, p := range scriptRefusals {
		if strings.HasPrefix(msg, p) {
			return "NOPERM permission denied in the script: " + msg[len("ERR "):], true
		}
	}
	return "", false
}

// counted adds script calls carrying decisions, in one round trip, to
// the Store's Stats.
func (s *Store) counted(scripts, decisions int) {
	if s.batch != nil {
		s.batch.trips.Add(1)
		s.batch.scripts.Add(uint64(scripts))
		s.batch.decisions.Add(uint64(decisions))
	}
}

// Stats are counters of a Store's traffic to Redis.
type Stats struct {
	Decisions   uint64 // decisions sent (each Take is one)
	ScriptCalls uint64 // script calls that carried them
	RoundTrips  uint64 // round trips to Redis that carried the script calls: on a Cluster a pipeline of several is one
}

// Stats returns the Store's counters; with batching off they are zero.
// Decisions / ScriptCalls is the mean batch size.
func (s *Store) Stats() Stats {
	if s.batch == nil {
		return Stats{}
	}
	return Stats{Decisions: s.batch.decisions.Load(), ScriptCalls: s.batch.scripts.Load(), RoundTrips: s.batch.trips.Load()}
}

// Close makes further calls fail with floodgate.ErrClosed, and closes the
// client if NewFromURL made it. It is safe to call more than once.
func (s *Store) Close() error {
	if s.closed.Swap(true) {
		return nil
	}
	if s.leases != nil {
		s.leases.close() // gives back what the leases have left
	}
	if s.batch != nil {
		s.batch.close()
	}
	if s.liftsStop != nil {
		close(s.liftsStop)
		<-s.liftsDone
	}
	if !s.owned {
		return nil
	}
	return s.client.Close()
}
