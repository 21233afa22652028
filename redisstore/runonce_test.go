package redisstore_test

import (
	"context"
	"errors"
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
// run. The server is stopped (SIGSTOP) while a call is sent, so that the
// client's read times out; go-redis would send it again on its other
// pooled connections, and once the server resumes it would run every
// copy: a rate limit charged four times, an acquire refused as "held
// already". The call fails with ErrStore, and runs once.
func TestTimedOutCallRunsOnce(t *testing.T) {
	srv := redistest.Start(t)
	ctx := context.Background()
	admin := srv.Admin(t)
	tests := []struct {
		name string
		// op makes the call under test; check reads its outcome
		// through a store on a client without the short timeout.
		op    func(ctx context.Context, c *floodgate.Limiter, cc *floodgate.Concurrency) error
		check func(t *testing.T, l *floodgate.Limiter, cc *floodgate.Concurrency)
	}{
		{"allow", func(ctx context.Context, l *floodgate.Limiter, _ *floodgate.Concurrency) error {
			_, err := l.Allow(ctx, "k")
			return err
		}, func(t *testing.T, l *floodgate.Limiter, _ *floodgate.Concurrency) {
			// Charged once by the call that timed out, once by this one.
			if r, err := l.Allow(ctx, "k"); err != nil || r.Remaining != 8 {
				t.Errorf("the next Allow: %+v, %v; want 8 remaining", r, err)
			}
		}},
		{"acquire", func(ctx context.Context, _ *floodgate.Limiter, c *floodgate.Concurrency) error {
			_, err := c.Acquire(ctx, "k")
			return err
		}, func(t *testing.T, _ *floodgate.Limiter, c *floodgate.Concurrency) {
			if in, err := c.Inspect(ctx, "k"); err != nil || in.Held != 1 {
				t.Errorf("held: %+v, %v; want 1", in, err)
			}
		}},
	}
	for _, fns := range []bool{true, false} {
		for _, tt := range tests {
			t.Run(tt.name+"/functions="+strconv.FormatBool(fns), func(t *testing.T) {
				if err := admin.FlushAll(ctx).Err(); err != nil {
					t.Fatal(err)
				}
				user, pass := srv.User()
				client := redis.NewClient(&redis.Options{Addr: srv.Addr, Username: user, Password: pass, TLSConfig: srv.TLS,
					ReadTimeout: 100 * time.Millisecond, MaxRetries: 3, MinRetryBackoff: time.Millisecond,
					MaxRetryBackoff: time.Millisecond, PoolSize: 4})
				t.Cleanup(func() { client.Close() })
				st := newStore(t, client, &redisstore.Options{Prefix: "once:", DisableFunctions: !fns})
				lim := limiter(t, st, floodgate.FixedWindow(10, time.Hour))
				conc, err := floodgate.NewConcurrency(st, 5, time.Hour, nil)
				if err != nil {
					t.Fatal(err)
				}
				// Load the library or scripts, and fill the pool.
				if _, err := lim.Allow(ctx, "warm"); err != nil {
					t.Fatal(err)
				}
				if _, err := conc.Acquire(ctx, "warm"); err != nil {
					t.Fatal(err)
				}
				// Four pooled connections, each ready for a send: go-redis
				// sends again on a connection it has set up.
				var conns []*redis.Conn
				for range 4 {
					c := client.Conn()
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
				if err := srv.Signal(syscall.SIGSTOP); err != nil {
					t.Fatal(err)
				}
				resumed := false
				resume := func() {
					if !resumed {
						resumed = true
						if err := srv.Signal(syscall.SIGCONT); err != nil {
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
				// The copies that a stopped server holds run as it resumes,
				// before it reads the next command of a new connection.
				if err := admin.Ping(ctx).Err(); err != nil {
					t.Fatal(err)
				}
				if n := scriptCalls(t, admin); n != 1 {
					t.Errorf("script calls that ran: %d, want 1", n)
				}
				fresh := newStore(t, srv.Client(t), &redisstore.Options{Prefix: "once:", DisableFunctions: !fns})
				c2, err := floodgate.NewConcurrency(fresh, 5, time.Hour, nil)
				if err != nil {
					t.Fatal(err)
				}
				tt.check(t, limiter(t, fresh, floodgate.FixedWindow(10, time.Hour)), c2)
			})
		}
	}
}

// scriptCalls returns how many FCALL and EVALSHA commands the server has
// run since its statistics were reset.
func scriptCalls(t *testing.T, c *redis.Client) int {
	t.Helper()
	info, err := c.Info(context.Background(), "commandstats").Result()
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, line := range strings.Split(info, "\n") {
		for _, cmd := range []string{"cmdstat_fcall:calls=", "cmdstat_evalsha:calls="} {
			if rest, ok := strings.CutPrefix(strings.TrimSpace(line), cmd); ok {
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
