package main

import (
	"flag"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/floodgate/floodgate"
	"github.com/floodgate/floodgate/fallback"
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
}

func (s *storeFlags) register(fs *flag.FlagSet, e *env) {
	fs.StringVar(&s.redis, "redis", e.str("FLOODGATE_REDIS", ""), "Redis URL, redis://[user:password@]host:port[/db] or rediss:// ($FLOODGATE_REDIS); the embedded in-memory store when empty")
	fs.StringVar(&s.cluster, "redis-cluster", e.str("FLOODGATE_REDIS_CLUSTER", ""), "comma-separated Redis Cluster nodes, host:port,... ($FLOODGATE_REDIS_CLUSTER)")
	fs.StringVar(&s.prefix, "redis-prefix", e.str("FLOODGATE_REDIS_PREFIX", "floodgate:"), "prefix of every Redis key ($FLOODGATE_REDIS_PREFIX)")
	fs.StringVar(&s.policy, "fallback", e.str("FLOODGATE_FALLBACK", "local"), "what to answer while Redis fails: local, fail-open or fail-closed ($FLOODGATE_FALLBACK)")
	fs.Int64Var(&s.instances, "instances", e.int("FLOODGATE_INSTANCES", 1), "how many floodgate instances share Redis; each one's local fallback gets 1/instances of each limit ($FLOODGATE_INSTANCES)")
	fs.DurationVar(&s.budget, "budget", e.duration("FLOODGATE_BUDGET", 50*time.Millisecond), "longest wait for Redis per decision before the fallback answers ($FLOODGATE_BUDGET)")
}

// redisClient builds the Redis client the flags name, or returns nil when
// they name none. It is the one place the command makes a client: every
// client has ContextTimeoutEnabled, so that a decision's deadline bounds
// its wait for a hung server.
func (s *storeFlags) redisClient() (client redis.UniversalClient, desc string, err error) {
	switch {
	case s.cluster != "":
		return redis.NewClusterClient(&redis.ClusterOptions{Addrs: splitList(s.cluster), ContextTimeoutEnabled: true}),
			"Redis Cluster " + s.cluster, nil
	case s.redis != "":
		o, err := redis.ParseURL(s.redis)
		if err != nil {
			return nil, "", fmt.Errorf("--redis: %w", err)
		}
		o.ContextTimeoutEnabled = true
		return redis.NewClient(o), "Redis at " + o.Addr, nil
	}
	return nil, "", nil
}

// openStore returns the store the flags ask for, the fallback store when
// it is Redis, a description, and a func that closes everything.
func openStore(f *storeFlags, log *slog.Logger) (floodgate.Store, *fallback.Store, string, func(), error) {
	client, desc, err := f.redisClient()
	if err != nil {
		return nil, nil, "", nil, err
	}
	if client == nil {
		s := floodgate.NewMemoryStore(nil)
		return s, nil, "embedded in-memory store", func() { s.Close() }, nil
	}
	policy, err := fallback.ParsePolicy(f.policy)
	if err != nil {
		client.Close()
		return nil, nil, "", nil, err
	}
	rs := redisstore.New(client, &redisstore.Options{Prefix: f.prefix})
	fb := fallback.New(rs, &fallback.Options{Policy: policy, Instances: f.instances, Budget: f.budget, Logger: log})
	desc += fmt.Sprintf(" (fallback %s, %d instances, budget %s)", policy, f.instances, f.budget)
	return fb, fb, desc, func() { fb.Close(); rs.Close(); client.Close() }, nil
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
