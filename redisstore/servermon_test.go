package redisstore_test

import (
	"bytes"
	"context"
	"log/slog"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/floodgate/floodgate/internal/testkit/redistest"
	"github.com/floodgate/floodgate/redisstore"
	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"
)

// logBuf is a logger whose warnings the tests count.
type logBuf struct{ bytes.Buffer }

func (b *logBuf) logger() *slog.Logger { return slog.New(slog.NewTextHandler(&b.Buffer, nil)) }

func (b *logBuf) count(s string) int { return strings.Count(b.String(), s) }

// TestMonitorPolicy reads the policy as it changes, and warns once per
// policy that evicts limits' keys, never on noeviction.
func TestMonitorPolicy(t *testing.T) {
	srv := redistest.Start(t)
	c, admin := srv.Client(t), srv.Admin(t)
	ctx := context.Background()
	var log logBuf
	m := redisstore.NewMonitor(c, &redisstore.MonitorOptions{Logger: log.logger()})
	warnings := 0
	for _, tc := range []struct {
		policy string
		warn   bool
	}{
		{"noeviction", false},
		{"allkeys-lru", true},
		{"allkeys-lru", false}, // warned already
		{"volatile-ttl", true},
		{"allkeys-lfu", true},
		{"noeviction", false},
		{"volatile-ttl", false},
	} {
		if err := admin.ConfigSet(ctx, "maxmemory-policy", tc.policy).Err(); err != nil {
			t.Fatal(err)
		}
		if err := m.Poll(ctx); err != nil {
			t.Fatal(err)
		}
		if tc.warn {
			warnings++
		}
		st := m.Status()
		if st.Policies[tc.policy] != 1 || len(st.Policies) != 1 {
			t.Errorf("%s: policies %v", tc.policy, st.Policies)
		}
		if got := log.count("maxmemory-policy evicts"); got != warnings {
			t.Errorf("after %s: %d warnings, want %d\n%s", tc.policy, got, warnings, log.String())
		}
		if redisstore.EvictsLimits(tc.policy) != (tc.policy != "noeviction") {
			t.Errorf("EvictsLimits(%q) = %v", tc.policy, !redisstore.EvictsLimits(tc.policy))
		}
	}
	if st := m.Status(); st.Restarts != 0 || st.Polls != 7 {
		t.Errorf("status %+v, want no restart, 7 polls", st)
	}
}

// TestMonitorRestart counts a restart of a server without persistence, and
// keeps the evictions it counted before it.
func TestMonitorRestart(t *testing.T) {
	srv := redistest.Start(t, "--maxmemory-policy", "allkeys-lru")
	ctx := context.Background()
	var log logBuf
	c := redis.NewClient(&redis.Options{Addr: srv.Addr, ContextTimeoutEnabled: true})
	defer c.Close()
	m := redisstore.NewMonitor(c, &redisstore.MonitorOptions{Logger: log.logger()})
	first := evictSome(t, c)
	if err := m.Poll(ctx); err != nil {
		t.Fatal(err)
	}
	if st := m.Status(); st.EvictedKeys != uint64(first) || st.Restarts != 0 {
		t.Fatalf("status %+v, want %d evicted, no restart", st, first)
	}
	srv.Restart(t)
	if err := m.Poll(ctx); err != nil {
		t.Fatal(err)
	}
	if st := m.Status(); st.EvictedKeys != uint64(first) || st.Restarts != 1 {
		t.Fatalf("after the restart: status %+v, want %d evicted, 1 restart", st, first)
	}
	if log.count("server restarted") != 1 {
		t.Errorf("want one restart warning:\n%s", log.String())
	}
	second := evictSome(t, c) // the counter started again at 0
	if err := m.Poll(ctx); err != nil {
		t.Fatal(err)
	}
	if st := m.Status(); st.EvictedKeys != uint64(first+second) || st.Restarts != 1 {
		t.Fatalf("status %+v, want %d evicted, 1 restart", st, first+second)
	}
	// A server that is down is an error, and counts nothing.
	srv.Stop()
	if err := m.Poll(ctx); err == nil {
		t.Error("a poll of a stopped server succeeded")
	}
	if st := m.Status(); st.Restarts != 1 || st.Policies["unknown"] != 1 {
		t.Errorf("status %+v with the server down", st)
	}
}

// TestMonitorRefused reads what an ACL allows and skips the rest quietly.
func TestMonitorRefused(t *testing.T) {
	srv := redistest.Start(t, "--maxmemory-policy", "volatile-lru")
	admin := srv.Admin(t)
	ctx := context.Background()
	for _, tc := range []struct {
		name, rules string
		policy      string
		runID       bool
	}{
		{"all", "+@all", "volatile-lru", true},
		{"no CONFIG", "+@all -config", "volatile-lru", true}, // INFO memory has maxmemory_policy
		{"no CONFIG, no INFO", "+@all -config -info", "unknown", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			user := strings.ReplaceAll(tc.name, " ", "")
			user = strings.ReplaceAll(user, ",", "")
			if err := admin.Do(ctx, append([]any{"ACL", "SETUSER", user, "on", ">pw", "~*"}, fields(tc.rules)...)...).Err(); err != nil {
				t.Fatal(err)
			}
			c := redis.NewClient(&redis.Options{Addr: srv.Addr, Username: user, Password: "pw"})
			defer c.Close()
			var log logBuf
			m := redisstore.NewMonitor(c, &redisstore.MonitorOptions{Logger: log.logger()})
			for range 2 {
				if err := m.Poll(ctx); err != nil {
					t.Fatal(err)
				}
			}
			if st := m.Status(); st.Policies[tc.policy] != 1 || st.Restarts != 0 {
				t.Errorf("status %+v, want policy %s", st, tc.policy)
			}
			if (log.count("maxmemory-policy evicts") == 1) != (tc.policy != "unknown") {
				t.Errorf("warnings:\n%s", log.String())
			}
		})
	}
}

func fields(s string) []any {
	var out []any
	for _, f := range strings.Fields(s) {
		out = append(out, f)
	}
	return out
}

// TestMonitorLoop drives the monitor's goroutine with injected ticks: a
// restart between two ticks is counted, and Close stops the goroutine.
func TestMonitorLoop(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	srv := redistest.Start(t)
	c := redis.NewClient(&redis.Options{Addr: srv.Addr, ContextTimeoutEnabled: true})
	defer c.Close()
	ticks := make(chan time.Time) // unbuffered: a send returns when the loop takes it
	var log logBuf
	m := redisstore.NewMonitor(c, &redisstore.MonitorOptions{Ticks: ticks, Logger: log.logger()})
	m.Start(context.Background())
	if st := m.Status(); st.Polls != 1 || st.Policies["noeviction"] != 1 {
		t.Fatalf("after Start: %+v", st)
	}
	srv.Restart(t)
	ticks <- time.Time{}
	ticks <- time.Time{} // taken once the first tick's reading is done
	m.Close()
	m.Close()
	if st := m.Status(); st.Polls != 3 || st.Restarts != 1 {
		t.Fatalf("status %+v, want 3 polls and 1 restart", st)
	}
}

// TestMonitorCluster reads every master of a Cluster, and counts the
// restart of one.
func TestMonitorCluster(t *testing.T) {
	cl := redistest.StartCluster(t, 3)
	c := cl.Client(t)
	ctx := context.Background()
	var log logBuf
	m := redisstore.NewMonitor(c, &redisstore.MonitorOptions{Logger: log.logger()})
	if err := m.Poll(ctx); err != nil {
		t.Fatal(err)
	}
	if st := m.Status(); st.Policies["noeviction"] != 3 {
		t.Fatalf("status %+v, want 3 masters on noeviction", st)
	}
	if err := cl.Servers[1].Admin(t).ConfigSet(ctx, "maxmemory-policy", "allkeys-lru").Err(); err != nil {
		t.Fatal(err)
	}
	cl.Servers[2].Restart(t)
	var st redisstore.ServerStatus
	for range 20 { // bounded: a stale connection to the restarted node may fail a poll
		m.Poll(ctx)
		if st = m.Status(); st.Restarts == 1 {
			break
		}
	}
	if st.Restarts != 1 || st.Policies["allkeys-lru"] != 1 || st.Policies["noeviction"] != 2 {
		t.Fatalf("status %+v, want one restart, one master on allkeys-lru", st)
	}
	if n := log.count("maxmemory-policy evicts"); n != 1 {
		t.Errorf("%d policy warnings, want 1", n)
	}
}

// evictSome fills the server behind c past 2mb of allkeys-lru, and
// returns its evicted_keys, which no longer grows.
func evictSome(t *testing.T, c *redis.Client) int64 {
	t.Helper()
	ctx := context.Background()
	if err := c.ConfigSet(ctx, "maxmemory", "2mb").Err(); err != nil {
		t.Fatal(err)
	}
	pipe := c.Pipeline()
	for i := range 30000 {
		pipe.Set(ctx, "k"+strconv.Itoa(i), "0123456789012345678901234567890123456789", 0)
	}
	if _, err := pipe.Exec(ctx); err != nil {
		t.Fatal(err)
	}
	// Redis may go on evicting in the background: stop it.
	if err := c.ConfigSet(ctx, "maxmemory", "0").Err(); err != nil {
		t.Fatal(err)
	}
	n, err := c.InfoMap(ctx, "stats").Result()
	if err != nil {
		t.Fatal(err)
	}
	e, _ := strconv.ParseInt(n["Stats"]["evicted_keys"], 10, 64)
	if e == 0 {
		t.Fatal("nothing was evicted")
	}
	return e
}

// TestMonitorRefusedBetweenPolls: evictions read, then refused by an ACL,
// then read again, are counted once.
func TestMonitorRefusedBetweenPolls(t *testing.T) {
	srv := redistest.Start(t, "--maxmemory-policy", "allkeys-lru")
	admin := srv.Admin(t)
	ctx := context.Background()
	if err := admin.Do(ctx, "ACL", "SETUSER", "mon", "on", ">pw", "~*", "+@all").Err(); err != nil {
		t.Fatal(err)
	}
	c := redis.NewClient(&redis.Options{Addr: srv.Addr, Username: "mon", Password: "pw"})
	defer c.Close()
	var log logBuf
	m := redisstore.NewMonitor(c, &redisstore.MonitorOptions{Logger: log.logger()})
	var evicted int64
	var known uint64 // what the monitor should have counted
	for _, step := range []struct {
		name  string
		acl   string // a rule for mon before the poll
		evict bool
	}{
		{"read", "", true},
		{"refused", "-info", false},
		{"refused, more evicted", "", true},
		{"read again", "+info", false},
		{"again", "", false},
	} {
		if step.evict {
			evicted = evictSome(t, admin)
		}
		if step.acl != "" {
			if err := admin.Do(ctx, "ACL", "SETUSER", "mon", step.acl).Err(); err != nil {
				t.Fatal(err)
			}
		}
		if err := m.Poll(ctx); err != nil {
			t.Fatal(err)
		}
		if step.acl != "-info" && step.name != "refused, more evicted" {
			known = uint64(evicted) // read: the server's count
		}
		if st := m.Status(); st.EvictedKeys != known || st.Restarts != 0 {
			t.Errorf("%s: status %+v, want %d evicted", step.name, st, known)
		}
	}
}
