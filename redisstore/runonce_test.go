package redisstore_test

import (
	"context"
	"errors"
	"math/rand/v2"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/floodgate/floodgate"
	"github.com/floodgate/floodgate/internal/testkit/redistest"
	"github.com/floodgate/floodgate/redisstore"
	"github.com/redis/go-redis/v9"
)

// A script call whose reply times out is not sent again: it may have
// run. The server (a Cluster's master of the key) is stopped with SIGSTOP
// while a call is sent, so that the client's read times out; go-redis
// would send it again on its other pooled connections, and once the
// server resumed it would run every copy: a rate limit charged four
// times, an acquire refused as "held already", a rebase that read its own
// limits as the old ones. The call fails with ErrStore, and runs once.
func TestTimedOutCallRunsOnce(t *testing.T) {
	ctx := context.Background()
	// A client of each kind whose reads time out soon, and what the call
	// under test on key k goes through: the server to stop, its pool of
	// connections on a client, and an admin client of it.
	type target struct {
		client func(t *testing.T) redis.UniversalClient
		node   func(t *testing.T, c redis.UniversalClient) (*redistest.Server, *redis.Client)
		fresh  func(t *testing.T) redis.UniversalClient
	}
	const timeout, tries = 100 * time.Millisecond, 3
	srv := redistest.Start(t)
	cluster := redistest.StartCluster(t, 3)
	targets := map[string]target{
		"standalone": {
			client: func(t *testing.T) redis.UniversalClient {
				user, pass := srv.User()
				c := redis.NewClient(&redis.Options{Addr: srv.Addr, Username: user, Password: pass, TLSConfig: srv.TLS,
					ReadTimeout: timeout, MaxRetries: tries, MinRetryBackoff: time.Millisecond,
					MaxRetryBackoff: time.Millisecond, PoolSize: 4})
				t.Cleanup(func() { c.Close() })
				return c
			},
			node: func(t *testing.T, c redis.UniversalClient) (*redistest.Server, *redis.Client) {
				return srv, c.(*redis.Client)
			},
			fresh: func(t *testing.T) redis.UniversalClient { return srv.Client(t) },
		},
		"cluster": {
			client: func(t *testing.T) redis.UniversalClient {
				user, pass := cluster.Servers[0].User()
				c := redis.NewClusterClient(&redis.ClusterOptions{Addrs: cluster.Addrs, Username: user, Password: pass,
					TLSConfig: cluster.TLS, ReadTimeout: timeout, MaxRedirects: tries, MinRetryBackoff: time.Millisecond,
					MaxRetryBackoff: time.Millisecond, PoolSize: 4})
				t.Cleanup(func() { c.Close() })
				return c
			},
			node: func(t *testing.T, c redis.UniversalClient) (*redistest.Server, *redis.Client) {
				node, err := c.(*redis.ClusterClient).MasterForKey(ctx, "k")
				if err != nil {
					t.Fatal(err)
				}
				for _, s := range cluster.Servers {
					if s.Addr == node.Options().Addr {
						return s, node
					}
				}
				t.Fatalf("no server at %s", node.Options().Addr)
				return nil, nil
			},
			fresh: func(t *testing.T) redis.UniversalClient { return cluster.Client(t) },
		},
	}
	tests := []struct {
		name string
		// op makes the call under test; check reads its outcome
		// through a store on a client without the short timeout.
		op    func(ctx context.Context, c *floodgate.Limiter, cc *floodgate.Concurrency) error
		check func(t *testing.T, l *floodgate.Limiter, cc *floodgate.Concurrency)
		cmds  []string // the commands the call sends
	}{
		{"allow", func(ctx context.Context, l *floodgate.Limiter, _ *floodgate.Concurrency) error {
			_, err := l.Allow(ctx, "k")
			return err
		}, func(t *testing.T, l *floodgate.Limiter, _ *floodgate.Concurrency) {
			// Charged once by the call that timed out, once by this one.
			if r, err := l.Allow(ctx, "k"); err != nil || r.Remaining != 8 {
				t.Errorf("the next Allow: %+v, %v; want 8 remaining", r, err)
			}
		}, scriptCmds},
		{"acquire", func(ctx context.Context, _ *floodgate.Limiter, c *floodgate.Concurrency) error {
			_, err := c.Acquire(ctx, "k")
			return err
		}, func(t *testing.T, _ *floodgate.Limiter, c *floodgate.Concurrency) {
			if in, err := c.Inspect(ctx, "k"); err != nil || in.Held != 1 {
				t.Errorf("held: %+v, %v; want 1", in, err)
			}
		}, scriptCmds},
		// Rebase records the limits with SET ... GET: sent again, it would
		// read them as the old ones.
		{"rebase", func(ctx context.Context, l *floodgate.Limiter, _ *floodgate.Concurrency) error {
			_, err := l.Rebase(ctx, "k", floodgate.Additive)
			return err
		}, func(t *testing.T, l *floodgate.Limiter, _ *floodgate.Concurrency) {
			if n, err := l.Rebase(ctx, "k", floodgate.Additive); n != 0 || err != nil {
				t.Errorf("Rebase to the limits recorded: %d, %v; want 0 carried", n, err)
			}
		}, []string{"set"}},
	}
	for _, kind := range []string{"standalone", "cluster"} {
		tg := targets[kind]
		for _, fns := range []bool{true, false} {
			for _, tt := range tests {
				t.Run(kind+"/"+tt.name+"/functions="+strconv.FormatBool(fns), func(t *testing.T) {
					prefix := "once" + strconv.Itoa(rand.Int()) + ":"
					opts := &redisstore.Options{Prefix: prefix, DisableFunctions: !fns}
					fresh := newStore(t, tg.fresh(t), opts)
					lim2 := limiter(t, fresh, floodgate.FixedWindow(10, time.Hour))
					conc2, err := floodgate.NewConcurrency(fresh, 5, time.Hour, nil)
					if err != nil {
						t.Fatal(err)
					}
					// Load the library or scripts where k's call goes,
					// through the client that waits: the store under test
					// sends its script calls once, and a slow moment of the
					// machine must not fail them.
					if _, err := lim2.AllowN(ctx, "k", 0); err != nil {
						t.Fatal(err)
					}
					if r, err := conc2.Acquire(ctx, "k"); err != nil {
						t.Fatal(err)
					} else if _, err := conc2.Release(ctx, r.Permit); err != nil {
						t.Fatal(err)
					}
					client := tg.client(t)
					st := newStore(t, client, opts)
					lim := limiter(t, st, floodgate.FixedWindow(10, time.Hour))
					conc, err := floodgate.NewConcurrency(st, 5, time.Hour, nil)
					if err != nil {
						t.Fatal(err)
					}
					server, node := tg.node(t, client)
					admin := server.Admin(t)
					// Four pooled connections, each ready for a send: go-redis
					// sends again on a connection it has set up.
					var conns []*redis.Conn
					for range 4 {
						c := node.Conn()
						if err := c.Ping(ctx).Err(); err != nil {
							t.Fatal(err)
						}
						conns = append(conns, c)
					}
					for _, c := range conns {
						c.Close()
					}
					if err := admin.ConfigResetStat(ctx).Err(); err != nil {
						t.Fatal(err)
					}
					if err := server.Signal(syscall.SIGSTOP); err != nil {
						t.Fatal(err)
					}
					resumed := false
					resume := func() {
						if !resumed {
							resumed = true
							if err := server.Signal(syscall.SIGCONT); err != nil {
								t.Error(err)
							}
						}
					}
					defer resume()
					err = tt.op(ctx, lim, conc)
					resume()
					if !errors.Is(err, floodgate.ErrStore) || errors.Is(err, floodgate.ErrInvalidPermit) {
						t.Errorf("the call while the server was stopped: %v, want ErrStore", err)
					}
					// The copies that a stopped server holds were readable
					// before this PING was sent: they run by the time it has
					// its reply, and INFO comes after them.
					if err := admin.Ping(ctx).Err(); err != nil {
						t.Fatal(err)
					}
					if n := commandCalls(t, admin, tt.cmds); n != 1 {
						t.Errorf("%v calls that ran: %d, want 1", tt.cmds, n)
					}
					tt.check(t, lim2, conc2)
				})
			}
		}
	}
}

// scriptCmds are the commands of a script call, once the script is
// loaded.
var scriptCmds = []string{"fcall", "evalsha"}

// commandCalls returns how many of cmds the server has run since its
// statistics were reset.
func commandCalls(t *testing.T, c *redis.Client, cmds []string) int {
	t.Helper()
	info, err := c.Info(context.Background(), "commandstats").Result()
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, line := range strings.Split(info, "\n") {
		for _, cmd := range cmds {
			if rest, ok := strings.CutPrefix(strings.TrimSpace(line), "cmdstat_"+cmd+":calls="); ok {
				v, _, _ := strings.Cut(rest, ",")
				k, err := strconv.Atoi(v)
				if err != nil {
					t.Fatalf("%q: %v", line, err)
				}
				n += k
			}
		}
	}
	return n
}
