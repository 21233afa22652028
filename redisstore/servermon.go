package redisstore

import (
	"context"
	"errors"
	"log/slog"
	"maps"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// MonitorOptions configures a Monitor. The zero value (or nil) gives the
// defaults.
type MonitorOptions struct {
	// Interval is how often the servers are read. Default: 30 seconds.
	Interval time.Duration
	// Timeout bounds one reading of every server. Default: 5 seconds.
	Timeout time.Duration
	// Logger receives the warnings: a policy that evicts limits, a
	// restart. Default: slog.Default().
	Logger *slog.Logger
	// Ticks, when set, replaces the ticker of Interval: the servers are
	// read once per value received, so that tests drive the loop.
	Ticks <-chan time.Time
}

// ServerStatus is what a Monitor read of the Redis servers.
type ServerStatus struct {
	// Policies counts the masters by maxmemory-policy; "unknown" counts
	// those that refused both CONFIG GET and INFO, or did not answer.
	Policies map[string]int
	// EvictedKeys is the keys the servers evicted (INFO stats'
	// evicted_keys, which counts every key, not only floodgate's), summed
	// over the masters and over the restarts seen: it never decreases
	// while the Monitor runs.
	EvictedKeys uint64
	// Restarts counts the times a server's run_id changed between two
	// readings: it restarted, empty unless it persists its data, or (behind
	// Sentinel) failed over to another server.
	Restarts uint64
	// Polls counts the readings done.
	Polls uint64
}

// EvictsLimits reports whether a maxmemory-policy lets Redis delete
// limits' keys when it is short of memory. Every policy but noeviction
// does: each of floodgate's keys has an expiry, so the volatile-* policies
// evict them too (and evict nothing else where other data never expires),
// and a deleted key is a full limit.
func EvictsLimits(policy string) bool {
	return policy != "noeviction" && policy != "unknown" && policy != ""
}

// Monitor reads, at start and every Interval, each Redis master's
// maxmemory-policy, evicted_keys and run_id, and warns (once per policy)
// on a policy that evicts limits and on every restart: both give limits
// back silently. It reads with CONFIG GET and INFO; where an ACL refuses
// them (or a managed Redis renames CONFIG), it reads what it may and
// skips the rest quietly. On a Cluster it reads every master. It never
// touches the decisions.
type Monitor struct {
	client redis.UniversalClient
	o      MonitorOptions

	mu       sync.Mutex
	nodes    map[string]*nodeState
	status   ServerStatus
	warned   map[string]bool // policies warned about
	stop     chan struct{}
	done     chan struct{}
	stopOnce sync.Once
}

// nodeState is what the last reading of one master found.
type nodeState struct {
	runID   string // "" when INFO server was refused
	evicted uint64 // evicted_keys as it last read
	policy  string
	// noEvicted is set when INFO stats was refused: evicted is the last
	// known value.
	noEvicted bool
}

// NewMonitor returns a Monitor of client's servers; Start starts it.
func NewMonitor(client redis.UniversalClient, opts *MonitorOptions) *Monitor {
	var o MonitorOptions
	if opts != nil {
		o = *opts
	}
	if o.Interval <= 0 {
		o.Interval = 30 * time.Second
	}
	if o.Timeout <= 0 {
		o.Timeout = 5 * time.Second
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	return &Monitor{client: client, o: o, nodes: map[string]*nodeState{}, warned: map[string]bool{},
		status: ServerStatus{Policies: map[string]int{}}}
}

// Start reads the servers once, then starts the goroutine that reads them
// every Interval until Close. A server that fails to answer is retried at
// the next reading.
func (m *Monitor) Start(ctx context.Context) {
	m.Poll(ctx)
	m.stop, m.done = make(chan struct{}), make(chan struct{})
	ticks := m.o.Ticks
	var t *time.Ticker
	if ticks == nil {
		t = time.NewTicker(m.o.Interval)
		ticks = t.C
	}
	go func() {
		defer close(m.done)
		if t != nil {
			defer t.Stop()
		}
		for {
			select {
			case <-m.stop:
				return
			case <-ticks:
			}
			ctx, cancel := context.WithTimeout(context.Background(), m.o.Timeout)
			m.Poll(ctx)
			cancel()
		}
	}()
}

// Close stops the goroutine that Start started and waits for it. It is
// safe to call more than once, and without Start.
func (m *Monitor) Close() {
	if m.stop == nil {
		return
	}
	m.stopOnce.Do(func() { close(m.stop) })
	<-m.done
}

// Status returns what the last reading found.
func (m *Monitor) Status() ServerStatus {
	m.mu.Lock()
	defer m.mu.Unlock()
	s := m.status
	s.Policies = maps.Clone(s.Policies)
	return s
}

// Poll reads every master now, bounded by ctx. It returns the first
// error of a server that did not answer at all; a refused command is no
// error.
func (m *Monitor) Poll(ctx context.Context) error {
	type reading struct {
		addr string
		st   nodeState
		err  error
	}
	var (
		mu       sync.Mutex
		readings []reading
	)
	read := func(ctx context.Context, addr string, c redis.Cmdable) error {
		st, err := readNode(ctx, c)
		mu.Lock()
		readings = append(readings, reading{addr, st, err})
		mu.Unlock()
		return nil
	}
	var err error
	switch c := m.client.(type) {
	case *redis.ClusterClient:
		err = c.ForEachMaster(ctx, func(ctx context.Context, n *redis.Client) error { return read(ctx, n.Options().Addr, n) })
	case *redis.Ring:
		err = c.ForEachShard(ctx, func(ctx context.Context, n *redis.Client) error { return read(ctx, n.Options().Addr, n) })
	default:
		err = read(ctx, "", c)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	m.status.Polls++
	seen := make(map[string]bool, len(readings))
	for _, r := range readings {
		seen[r.addr] = true
		if r.err != nil {
			if err == nil {
				err = r.err
			}
			continue // keep what it had: a restart while it was away shows next time
		}
		m.update(r.addr, r.st)
	}
	for addr := range m.nodes {
		if !seen[addr] {
			delete(m.nodes, addr) // no longer a master
		}
	}
	m.status.Policies = map[string]int{}
	for _, r := range readings {
		p := "unknown"
		if n := m.nodes[r.addr]; n != nil && r.err == nil && n.policy != "" {
			p = n.policy
		}
		m.status.Policies[p]++
	}
	return err
}

// update records a reading of the master at addr; m.mu is held.
func (m *Monitor) update(addr string, st nodeState) {
	prev := m.nodes[addr]
	restarted := prev != nil && st.runID != "" && prev.runID != "" && st.runID != prev.runID
	if restarted {
		m.status.Restarts++
		m.o.Logger.Warn("redisstore: the Redis server restarted (its run_id changed): unless it persists its data or a replica took over, every limit on it is back to full",
			"server", nodeName(addr), "run_id", st.runID)
	}
	if st.runID == "" && prev != nil {
		st.runID = prev.runID // INFO server refused this time: the last known
	}
	switch {
	case st.noEvicted: // INFO stats refused: count nothing, keep the last known
		if prev != nil && !restarted {
			st.evicted = prev.evicted
		}
	case prev == nil || restarted: // the server's count is all new to us
		m.status.EvictedKeys += st.evicted
	case st.evicted >= prev.evicted:
		m.status.EvictedKeys += st.evicted - prev.evicted
	default: // the count went back (CONFIG RESETSTAT)
		m.status.EvictedKeys += st.evicted
	}
	m.nodes[addr] = &st
	if EvictsLimits(st.policy) && !m.warned[st.policy] {
		m.warned[st.policy] = true
		m.o.Logger.Warn("redisstore: Redis's maxmemory-policy evicts limits' keys when it is short of memory, and an evicted key is a full limit: set maxmemory-policy noeviction, with memory to spare",
			"server", nodeName(addr), "maxmemory_policy", st.policy)
	}
}

func nodeName(addr string) string {
	if addr == "" {
		return "redis"
	}
	return addr
}

// readNode reads one server's maxmemory-policy, evicted_keys and run_id.
// A command the server refuses (an ACL, a renamed CONFIG) leaves its
// fields empty; only a server that does not answer is an error.
func readNode(ctx context.Context, c redis.Cmdable) (nodeState, error) {
	var st nodeState
	cfg, err := c.ConfigGet(ctx, "maxmemory-policy").Result()
	if err == nil {
		st.policy = cfg["maxmemory-policy"]
	} else if !isRefusal(err) {
		return st, err
	}
	// One INFO with several sections needs Redis 7: one call per section.
	st.noEvicted = true
	for _, sec := range []string{"server", "stats", "memory"} {
		info, err := c.Info(ctx, sec).Result()
		if err != nil {
			if !isRefusal(err) {
				return st, err
			}
			continue
		}
		switch sec {
		case "server":
			st.runID = infoField(info, "run_id")
		case "stats":
			if n, err := strconv.ParseUint(infoField(info, "evicted_keys"), 10, 64); err == nil {
				st.evicted, st.noEvicted = n, false
			}
		case "memory":
			if st.policy == "" {
				st.policy = infoField(info, "maxmemory_policy")
			}
		}
	}
	return st, nil
}

// isRefusal reports whether err is the server's refusal of a command
// (an ACL's NOPERM, a renamed or disabled command's ERR), not a failure
// to reach it.
func isRefusal(err error) bool {
	var re redis.Error
	if !errors.As(err, &re) {
		return false
	}
	msg := err.Error()
	return strings.HasPrefix(msg, "NOPERM") || strings.HasPrefix(msg, "ERR")
}

// infoField returns the value of field in an INFO reply, or "".
func infoField(info, field string) string {
	for line := range strings.Lines(info) {
		if v, ok := strings.CutPrefix(line, field+":"); ok {
			return strings.TrimRight(v, "\r\n")
		}
	}
	return ""
}
