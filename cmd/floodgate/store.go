package main

import (
	"crypto/tls"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/floodgate/floodgate"
	"github.com/floodgate/floodgate/fallback"
	"github.com/floodgate/floodgate/internal/server/tlsconf"
	"github.com/floodgate/floodgate/redisstore"
	"github.com/redis/go-redis/v9"
)

// storeFlags are the flags that choose and tune the store.
type storeFlags struct {
	redis     string
	cluster   string
	prefix    string
	policy    string
	instances int64
	budget    time.Duration
	maxKeys   int64
	maxBytes  string
	// denialCache is the Redis store's DenialCache.
	denialCache bool
	// tls is the TLS to Redis (--redis-tls-*); minVersion as the flag
	// reads, "1.2" or "1.3".
	tls        tlsconf.ClientFiles
	minVersion string
	// monitor is how often the Redis servers' eviction policy, evictions
	// and restarts are read; 0 never.
	monitor time.Duration
}

func (s *storeFlags) register(fs *flag.FlagSet, e *env) {
	fs.StringVar(&s.redis, "redis", e.str("FLOODGATE_REDIS", ""), "Redis URL, redis://[user:password@]host:port[/db] or rediss://, or through Sentinel redis+sentinel://host:port[/db]?master_name=NAME&addr=host2:port2, or a Cluster redis+cluster://host:port?addr=host2:port2 ($FLOODGATE_REDIS); the embedded in-memory store when empty")
	fs.StringVar(&s.cluster, "redis-cluster", e.str("FLOODGATE_REDIS_CLUSTER", ""), "comma-separated Redis Cluster nodes, host:port,... ($FLOODGATE_REDIS_CLUSTER)")
	fs.StringVar(&s.prefix, "redis-prefix", e.str("FLOODGATE_REDIS_PREFIX", "floodgate:"), "prefix of every Redis key ($FLOODGATE_REDIS_PREFIX)")
	fs.StringVar(&s.policy, "fallback", e.str("FLOODGATE_FALLBACK", "local"), "what to answer while Redis fails: local, fail-open or fail-closed ($FLOODGATE_FALLBACK)")
	fs.Int64Var(&s.instances, "instances", e.int("FLOODGATE_INSTANCES", 1), "how many floodgate instances share Redis; each one's local fallback gets 1/instances of each limit ($FLOODGATE_INSTANCES)")
	fs.DurationVar(&s.budget, "budget", e.duration("FLOODGATE_BUDGET", 50*time.Millisecond), "longest wait for Redis per decision before the fallback answers ($FLOODGATE_BUDGET)")
	fs.BoolVar(&s.denialCache, "denial-cache", e.bool("FLOODGATE_DENIAL_CACHE", false), "with Redis, answer a request that Redis denied a moment ago (same key, limits and cost) locally until its retry-after, exactly as Redis would, floodgate's and Envoy's requests alike ($FLOODGATE_DENIAL_CACHE)")
	fs.DurationVar(&s.monitor, "redis-monitor", e.duration("FLOODGATE_REDIS_MONITOR", 30*time.Second), "how often to read each Redis master's maxmemory-policy, evicted keys and run_id, for the metrics, the dashboard and a warning on a policy that evicts limits or a restart; 0 never ($FLOODGATE_REDIS_MONITOR)")
	fs.StringVar(&s.tls.CA, "redis-tls-ca", e.str("FLOODGATE_REDIS_TLS_CA", ""), "PEM CA certificates that Redis's certificate must chain to, instead of the system's; turns TLS to Redis on; reloaded on SIGHUP ($FLOODGATE_REDIS_TLS_CA)")
	fs.StringVar(&s.tls.Cert, "redis-tls-cert", e.str("FLOODGATE_REDIS_TLS_CERT", ""), "PEM client certificate (chain) to present to Redis (tls-auth-clients yes); turns TLS to Redis on; reloaded on SIGHUP ($FLOODGATE_REDIS_TLS_CERT)")
	fs.StringVar(&s.tls.Key, "redis-tls-key", e.str("FLOODGATE_REDIS_TLS_KEY", ""), "PEM private key of --redis-tls-cert ($FLOODGATE_REDIS_TLS_KEY)")
	fs.StringVar(&s.tls.ServerName, "redis-tls-server-name", e.str("FLOODGATE_REDIS_TLS_SERVER_NAME", ""), "name that every Redis server's certificate must hold; by default each server's host as dialed; turns TLS to Redis on ($FLOODGATE_REDIS_TLS_SERVER_NAME)")
	fs.BoolVar(&s.tls.InsecureSkipVerify, "redis-tls-insecure-skip-verify", e.bool("FLOODGATE_REDIS_TLS_INSECURE_SKIP_VERIFY", false), "accept any certificate from Redis: encrypted, but open to a man in the middle; for tests only; turns TLS to Redis on ($FLOODGATE_REDIS_TLS_INSECURE_SKIP_VERIFY)")
	fs.StringVar(&s.minVersion, "redis-tls-min-version", e.str("FLOODGATE_REDIS_TLS_MIN_VERSION", "1.2"), "oldest TLS version spoken with Redis: 1.2 or 1.3 ($FLOODGATE_REDIS_TLS_MIN_VERSION)")
	fs.Int64Var(&s.maxKeys, "memory-max-keys", e.int("FLOODGATE_MEMORY_MAX_KEYS", 1<<20), "most keys the embedded store (or the local fallback) holds ($FLOODGATE_MEMORY_MAX_KEYS)")
	fs.StringVar(&s.maxBytes, "memory-max-bytes", e.str("FLOODGATE_MEMORY_MAX_BYTES", "192MiB"), "most memory the embedded store's (or the local fallback's) keys take: bytes, or with KiB, MiB or GiB ($FLOODGATE_MEMORY_MAX_BYTES)")
}

// parseBytes reads "192MiB", "64KiB", "1GiB" or a plain number of bytes.
func parseBytes(s string) (int64, error) {
	s = strings.TrimSpace(s)
	mult := int64(1)
	for suffix, m := range map[string]int64{"KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30} {
		if n, ok := strings.CutSuffix(s, suffix); ok {
			s, mult = strings.TrimSpace(n), m
			break
		}
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil || n < 1 || n > (1<<62)/mult {
		return 0, fmt.Errorf("%q is not a size in bytes (like 192MiB)", s)
	}
	return n * mult, nil
}

// memoryStore returns the memory store the flags describe.
func (s *storeFlags) memoryStore() (*floodgate.MemoryStore, error) {
	if s.maxKeys < 1 {
		return nil, fmt.Errorf("--memory-max-keys ($FLOODGATE_MEMORY_MAX_KEYS) must be at least 1, got %d", s.maxKeys)
	}
	b, err := parseBytes(s.maxBytes)
	if err != nil {
		return nil, fmt.Errorf("--memory-max-bytes ($FLOODGATE_MEMORY_MAX_BYTES): %w", err)
	}
	return floodgate.NewMemoryStore(&floodgate.MemoryOptions{MaxKeys: int(min(s.maxKeys, 1<<40)), MaxBytes: b}), nil
}

// redisClient builds the Redis client the flags name, or returns nil when
// they name none. It is the one place the command makes a client: every
// client has ContextTimeoutEnabled, so that a decision's deadline bounds
// its wait for a hung server.
func (s *storeFlags) redisClient(tc *tlsconf.Client) (client redis.UniversalClient, desc string, err error) {
	var dial redisstore.Dialer
	if tc != nil {
		dial = tc.Dial
	}
	switch {
	case s.cluster != "":
		// As the URL redis+cluster://node1?addr=node2&addr=..., so that
		// redisstore makes every client alike.
		u := "redis+cluster://"
		if addrs := splitList(s.cluster); len(addrs) > 0 {
			u += addrs[0] + "?" + url.Values{"addr": addrs[1:]}.Encode()
		}
		c, err := redisstore.NewClientDialer(u, dial)
		if err != nil {
			return nil, "", fmt.Errorf("--redis-cluster: %w", err)
		}
		return c, "Redis Cluster " + s.cluster, nil
	case s.redis != "":
		c, err := redisstore.NewClientDialer(s.redis, dial)
		if err != nil {
			return nil, "", fmt.Errorf("--redis: %w", err)
		}
		u, _ := url.Parse(s.redis) // NewClient parsed it
		switch c := c.(type) {
		case *redis.ClusterClient:
			return c, "Redis Cluster at " + strings.Join(c.Options().Addrs, ","), nil
		case *redis.Client:
			if strings.Contains(s.redis, "+sentinel://") {
				return c, fmt.Sprintf("Redis master %q through Sentinel at %s", u.Query().Get("master_name"), u.Host), nil
			}
			return c, "Redis at " + c.Options().Addr, nil
		}
		return c, "Redis at " + u.Host, nil
	}
	return nil, "", nil
}

// opened is the store the flags ask for, and what the service reports of
// it.
type opened struct {
	store    floodgate.Store
	fallback *fallback.Store        // nil without Redis
	memory   *floodgate.MemoryStore // the embedded store, or Redis's local fallback; nil for the others
	monitor  *redisstore.Monitor    // nil without Redis or with --redis-monitor 0
	redisTLS *tlsconf.Client        // nil without --redis-tls-*
	desc     string
	close    func()
}

// redisTLS loads the TLS to Redis that the flags ask for, or returns nil
// when they ask for none. It warns of --redis-tls-insecure-skip-verify
// and of a client certificate that has expired.
func (s *storeFlags) redisTLS(log *slog.Logger) (*tlsconf.Client, error) {
	if err := s.urlTLS(); err != nil {
		return nil, err
	}
	v, err := tlsconf.ParseVersion(s.minVersion)
	if err != nil {
		return nil, fmt.Errorf("--redis-tls-min-version ($FLOODGATE_REDIS_TLS_MIN_VERSION): %w", err)
	}
	files := s.tls
	if files == (tlsconf.ClientFiles{}) {
		if v != tls.VersionTLS12 {
			return nil, errors.New("--redis-tls-min-version needs TLS to Redis: a --redis-tls-* flag")
		}
		return nil, nil
	}
	if s.redis == "" && s.cluster == "" {
		return nil, errors.New("--redis-tls-* flags need --redis or --redis-cluster")
	}
	files.MinVersion = v
	c, err := tlsconf.LoadClient(files)
	if err != nil {
		return nil, fmt.Errorf("--redis-tls-*: %w", err)
	}
	if files.InsecureSkipVerify {
		log.Warn("floodgate: --redis-tls-insecure-skip-verify: Redis's certificate is NOT checked; anyone on the path can pose as Redis")
	}
	warnExpiry(c, log)
	return c, nil
}

// urlTLS moves the tls_* query options of --redis (tls_ca, tls_cert,
// tls_key, tls_server_name, tls_min_version, tls_insecure_skip_verify)
// into the --redis-tls-* flags they stand for, and out of the URL, which
// go-redis would refuse with them. An option and its flag both set
// differently is an error.
func (s *storeFlags) urlTLS() error {
	if !strings.Contains(s.redis, "tls_") {
		return nil
	}
	u, err := url.Parse(s.redis)
	if err != nil {
		return nil // NewClient says why
	}
	q := u.Query()
	for _, o := range []struct {
		name string
		flag *string
	}{{"tls_ca", &s.tls.CA}, {"tls_cert", &s.tls.Cert}, {"tls_key", &s.tls.Key}, {"tls_server_name", &s.tls.ServerName}, {"tls_min_version", &s.minVersion}} {
		if !q.Has(o.name) {
			continue
		}
		v := q.Get(o.name)
		q.Del(o.name)
		switch {
		case *o.flag == "" || (o.name == "tls_min_version" && *o.flag == "1.2"):
			*o.flag = v
		case *o.flag != v:
			return fmt.Errorf("--redis: %s=%s, but its flag says %s", o.name, v, *o.flag)
		}
	}
	if q.Has("tls_insecure_skip_verify") {
		b, err := strconv.ParseBool(q.Get("tls_insecure_skip_verify"))
		if err != nil {
			return fmt.Errorf("--redis: tls_insecure_skip_verify: %w", err)
		}
		s.tls.InsecureSkipVerify = s.tls.InsecureSkipVerify || b
		q.Del("tls_insecure_skip_verify")
	}
	u.RawQuery = q.Encode()
	s.redis = u.String()
	return nil
}

// warnExpiry warns when c's client certificate has expired: Redis will
// refuse it.
func warnExpiry(c *tlsconf.Client, log *slog.Logger) {
	if exp := c.Expiry(); !exp.IsZero() && time.Now().After(exp) {
		log.Warn("floodgate: the Redis TLS client certificate has expired; Redis will refuse it", "cert", c.Files().Cert, "not_after", exp.UTC().Format(time.RFC3339))
	}
}

// openStore opens the store the flags ask for, logging to log with the
// component of each part. onSwitch, when set, hears the fallback's
// switches.
func openStore(f *storeFlags, log *slog.Logger, onSwitch func(fallback.State)) (*opened, error) {
	policy, err := fallback.ParseMode(f.policy)
	if err != nil {
		return nil, err
	}
	rtls, err := f.redisTLS(log)
	if err != nil {
		return nil, err
	}
	client, desc, err := f.redisClient(rtls)
	if err != nil {
		return nil, err
	}
	if rtls != nil {
		desc += " over TLS"
	}
	var mem *floodgate.MemoryStore
	if client == nil || policy == fallback.Local {
		if mem, err = f.memoryStore(); err != nil {
			if client != nil {
				client.Close()
			}
			return nil, err
		}
	}
	if client == nil {
		return &opened{store: mem, memory: mem, desc: "embedded in-memory store", close: func() { mem.Close() }}, nil
	}
	rs := redisstore.New(client, &redisstore.Options{Prefix: f.prefix, DenialCache: f.denialCache, Logger: log.With("component", "redis")})
	// The health checks keep readiness honest with no traffic: a Redis
	// that dies is seen within one interval.
	o := &fallback.Options{Mode: policy, Instances: f.instances, Budget: f.budget, Logger: log.With("component", "fallback"), OnSwitch: onSwitch,
		HealthInterval: 100 * time.Millisecond}
	if mem != nil {
		o.Local = mem
	}
	if f.monitor < 0 {
		client.Close()
		if mem != nil {
			mem.Close()
		}
		return nil, fmt.Errorf("--redis-monitor ($FLOODGATE_REDIS_MONITOR) must not be negative, got %s", f.monitor)
	}
	fb := fallback.New(rs, o)
	desc += fmt.Sprintf(" (fallback %s, %d instances, budget %s", policy, f.instances, f.budget)
	if f.denialCache {
		desc += ", denial cache"
	}
	desc += ")"
	var mon *redisstore.Monitor
	if f.monitor > 0 {
		mon = redisstore.NewMonitor(client, &redisstore.MonitorOptions{Interval: f.monitor, Logger: log.With("component", "monitor")})
	}
	return &opened{store: fb, fallback: fb, memory: mem, desc: desc, monitor: mon, redisTLS: rtls, close: func() {
		if mon != nil {
			mon.Close()
		}
		fb.Close()
		rs.Close()
		client.Close()
		if mem != nil {
			mem.Close()
		}
	}}, nil
}

func splitList(s string) []string {
	var out []string
	for _, p := range strings.Split(s, ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}
