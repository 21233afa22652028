package redisstore_test

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/floodgate/floodgate"
	"github.com/floodgate/floodgate/core"
	"github.com/floodgate/floodgate/fallback"
	"github.com/floodgate/floodgate/internal/testkit/redistest"
	"github.com/floodgate/floodgate/redisstore"
	"github.com/floodgate/floodgate/storetest"
	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"
)

var prefixes atomic.Int64

// factory returns a storetest.NewStore whose stores share client, each
// under its own key prefix so that scenarios running in parallel do not
// meet.
func factory(client redis.UniversalClient, opts ...func(*redisstore.Options)) storetest.NewStore {
	return func(t *testing.T, clock floodgate.Clock) floodgate.Store {
		o := &redisstore.Options{Prefix: fmt.Sprintf("t%d:", prefixes.Add(1)), Clock: clock}
		for _, f := range opts {
			f(o)
		}
		return newStore(t, client, o)
	}
}

func TestConformanceStandalone(t *testing.T) {
	srv := redistest.Start(t)
	storetest.Run(t, factory(srv.Client(t)))
}

// Batching is on by default; the suite also holds with it off, and with
// batches of two so that its concurrency check splits batches.
func TestConformanceBatchOptions(t *testing.T) {
	srv := redistest.Start(t)
	t.Run("unbatched", func(t *testing.T) {
		storetest.Run(t, factory(srv.Client(t), func(o *redisstore.Options) { o.DisableBatching = true }))
	})
	t.Run("no-fast-path", func(t *testing.T) {
		newStore := factory(srv.Client(t))
		storetest.Run(t, func(t *testing.T, clock floodgate.Clock) floodgate.Store {
			st := newStore(t, clock).(*redisstore.Store)
			st.DisableFastPath()
			return st
		})
	})
	t.Run("scripts-only", func(t *testing.T) {
		storetest.Run(t, factory(srv.Client(t), func(o *redisstore.Options) { o.DisableFunctions = true }))
	})
	t.Run("denial-cache", func(t *testing.T) {
		storetest.Run(t, factory(srv.Client(t), func(o *redisstore.Options) { o.DenialCache = true }))
	})
	t.Run("leases", func(t *testing.T) {
		storetest.Run(t, factory(srv.Client(t), func(o *redisstore.Options) { o.Leases = &redisstore.LeaseOptions{} }))
	})
	t.Run("batches-of-2", func(t *testing.T) {
		storetest.Run(t, factory(srv.Client(t), func(o *redisstore.Options) { o.MaxBatch, o.MaxInflight = 2, 1 }))
	})
}

// floodgate serve puts a fallback store in front of Redis: the pair
// passes the suite as Redis alone does (Rebase on a calendar window
// crashed serve there).
func TestConformanceFallback(t *testing.T) {
	srv := redistest.Start(t)
	newStore := factory(srv.Client(t))
	storetest.Run(t, func(t *testing.T, clock floodgate.Clock) floodgate.Store {
		return fallback.New(newStore(t, clock), &fallback.Options{Clock: clock, Budget: -1, Logger: slog.New(slog.DiscardHandler)})
	})
}

func TestConformanceCluster(t *testing.T) {
	cluster := redistest.StartCluster(t, 3)
	client := cluster.Client(t)
	storetest.Run(t, factory(client))
	// The fast path ran as a function: its library is on every master.
	err := cluster.Admin(t).ForEachMaster(context.Background(), func(ctx context.Context, c *redis.Client) error {
		libs, err := c.FunctionList(ctx, redis.FunctionListQuery{LibraryNamePattern: "floodgate_*"}).Result()
		if err == nil && len(libs) != 1 {
			err = fmt.Errorf("%s holds libraries %+v, want floodgate's", c.Options().Addr, libs)
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
}

// TestKeysShareSlot checks that every Redis key of one decision is in one
// Cluster slot, including keys with braces of their own.
func TestKeysShareSlot(t *testing.T) {
	cluster := redistest.StartCluster(t, 3)
	client := cluster.Client(t)
	st := newStore(t, client, &redisstore.Options{Prefix: "slot:"})
	limits := []floodgate.Limit{floodgate.PerSecond(5), floodgate.FixedWindow(10, time.Minute),
		floodgate.SlidingWindow(10, time.Minute), floodgate.SlidingLog(3, time.Minute)}
	lim := limiter(t, st, limits...)
	for _, key := range []string{"user:1", "{a}b", "}", "{", "a{}b", "{x}{y}", strings.Repeat("é", 200)} {
		if _, err := lim.AllowN(context.Background(), key, 1); err != nil {
			t.Errorf("key %q: %v", key, err)
		}
	}
}

func TestServerTime(t *testing.T) {
	srv := redistest.Start(t)
	st := newStore(t, srv.Client(t), nil)
	lim, err := floodgate.NewLimiter(st, []floodgate.Limit{floodgate.GCRA(15, 30, time.Minute)}, nil)
	if err != nil {
		t.Fatal(err)
	}
	// The redis-cell README example on a fresh key, on the server's clock.
	r, err := lim.Allow(context.Background(), "user123")
	if err != nil {
		t.Fatal(err)
	}
	if !r.Allowed || r.Quota != 16 || r.Remaining != 15 || r.ResetAfter != 2*time.Second {
		t.Fatalf("CL.THROTTLE user123 15 30 60 = %+v, want allowed, 16, 15, reset 2s", r)
	}
	// The key lives until the bucket is full again, 2s, and at most a
	// second after (see bucketExpiry).
	ttl, err := srv.Admin(t).PTTL(context.Background(), "floodgate:{user123}:0b").Result()
	if err != nil || ttl < 2*time.Second-100*time.Millisecond || ttl > 3*time.Second {
		t.Fatalf("key TTL = %s, %v; want the 2s reset, and at most a second more", ttl, err)
	}
}

func TestHostileState(t *testing.T) {
	srv := redistest.Start(t)
	client, admin := srv.Client(t), srv.Admin(t)
	ctx := context.Background()
	st := newStore(t, client, &redisstore.Options{Prefix: "h:"})
	tests := []struct {
		name  string
		limit floodgate.Limit
		key   string
		setup func() error
		want  string
	}{
		{"list where a bucket is", floodgate.PerSecond(1), "h:{a}:0b", func() error { return admin.LPush(ctx, "h:{a}:0b", "x").Err() }, "wrong type"},
		{"garbage bucket", floodgate.PerSecond(1), "h:{b}:0b", func() error { return client.Set(ctx, "h:{b}:0b", "hello", 0).Err() }, "corrupt state"},
		{"float bucket", floodgate.PerSecond(1), "h:{c}:0b", func() error { return client.Set(ctx, "h:{c}:0b", "1.5:0:1", 0).Err() }, "corrupt state"},
		{"garbage window", floodgate.FixedWindow(1, time.Second), "h:{d}:0f", func() error { return client.Set(ctx, "h:{d}:0f", "12:13", 0).Err() }, "corrupt state"},
		{"garbage counter", floodgate.SlidingWindow(1, time.Second), "h:{e}:0s", func() error { return client.Set(ctx, "h:{e}:0s", "a:b:c", 0).Err() }, "corrupt state"},
		{"string where a log is", floodgate.SlidingLog(1, time.Second), "h:{f}:0l", func() error { return client.Set(ctx, "h:{f}:0l", "x", 0).Err() }, "wrong type"},
		{"binary bucket with a fraction", floodgate.PerSecond(1), "h:{h}:0b", func() error {
			return client.Set(ctx, "h:{h}:0b", rawBucket(1, 1.5, 0, 0), 0).Err()
		}, "corrupt state"},
		{"binary bucket, negative", floodgate.PerSecond(1), "h:{i}:0b", func() error {
			return client.Set(ctx, "h:{i}:0b", rawBucket(2, 1, 0, 0, 0, 10, -1), 0).Err()
		}, "corrupt state"},
		{"binary bucket, not a number", floodgate.PerSecond(1), "h:{j}:0b", func() error {
			return client.Set(ctx, "h:{j}:0b", rawBucket(1, math.NaN(), 0, 0), 0).Err()
		}, "corrupt state"},
		{"binary bucket, infinite", floodgate.PerSecond(1), "h:{k}:0b", func() error {
			return client.Set(ctx, "h:{k}:0b", rawBucket(1, 1, 0, math.Inf(1)), 0).Err()
		}, "corrupt state"},
		{"binary bucket, cut short", floodgate.PerSecond(1), "h:{m}:0b", func() error {
			return client.Set(ctx, "h:{m}:0b", rawBucket(1, 1, 0, 0)[:24], 0).Err()
		}, "corrupt state"},
		{"binary window with a fraction", floodgate.FixedWindow(1, time.Second), "h:{n}:0f", func() error {
			return client.Set(ctx, "h:{n}:0f", rawBucket(5, 0, 1e6, 1.5, 0, 0), 0).Err()
		}, "corrupt state"},
		{"binary window, negative count", floodgate.FixedWindow(1, time.Second), "h:{o}:0f", func() error {
			return client.Set(ctx, "h:{o}:0f", rawBucket(6, 0, 1e6, -1, 0, 0), 0).Err()
		}, "corrupt state"},
		{"binary window, not a number", floodgate.FixedWindow(1, time.Second), "h:{p}:0f", func() error {
			return client.Set(ctx, "h:{p}:0f", rawBucket(5, math.NaN(), 1e6, 1, 0, 0), 0).Err()
		}, "corrupt state"},
		{"binary window, cut short", floodgate.FixedWindow(1, time.Second), "h:{q}:0f", func() error {
			return client.Set(ctx, "h:{q}:0f", rawBucket(5, 0, 1e6, 1, 0, 0)[:40], 0).Err()
		}, "corrupt state"},
		{"binary window with a bucket's form", floodgate.FixedWindow(1, time.Second), "h:{r}:0f", func() error {
			return client.Set(ctx, "h:{r}:0f", rawBucket(1, 0, 1e6, 1), 0).Err()
		}, "corrupt state"},
		{"fractional log score", floodgate.SlidingLog(1, time.Second), "h:{g}:0l", func() error {
			return client.ZAdd(ctx, "h:{g}:0l", redis.Z{Score: 1.5, Member: "m"}).Err()
		}, "corrupt state"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if err := tt.setup(); err != nil {
				t.Fatal(err)
			}
			key := strings.TrimSuffix(strings.TrimPrefix(tt.key, "h:{"), "}:0"+tt.key[len(tt.key)-1:])
			r, err := limiter(t, st, tt.limit).AllowN(ctx, key, 1)
			if !errors.Is(err, floodgate.ErrKey) || !errors.Is(err, floodgate.ErrStore) || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("Take = %+v, %v; want an ErrKey (and ErrStore) saying %q", r, err, tt.want)
			}
			if strings.Contains(err.Error(), "script:") || strings.Contains(err.Error(), "stack") {
				t.Errorf("error shows Lua internals: %v", err)
			}
		})
	}
}

// TestBucketState checks the forms of a bucket's state through both
// scripts: binary, "\1" and tat, d, e as doubles (TAT in µs, latest charge
// at tat-d, e the time its expiry is known to hold until, 0 on an injected
// clock) or "\2" and tat, d, e, f, R, skew (plus f/R µs, and the skew
// after a clock step), and the decimal forms of earlier versions, "tat:d",
// "tat:d:f:R:skew", "tat" and "tat:f:R", which each reads. Each writes the
// short form unless the TAT has a fraction or the key a skew.
func TestBucketState(t *testing.T) {
	srv := redistest.Start(t)
	client := srv.Client(t)
	ctx := context.Background()
	now := storetest.Base.UnixMicro()
	us := func(d int64) string { return strconv.FormatInt(now+d, 10) }
	tests := []struct {
		name      string
		limit     floodgate.Limit
		before    string // the key's state, "" for none
		remaining int64
		after     string
	}{
		{"fresh, even rate", floodgate.TokenBucket(10, time.Second, 10), "", 9, bucketState(now+100000, 100000, 0)},
		{"short form", floodgate.TokenBucket(10, time.Second, 10), bucketState(now+500000, 700000, 0), 4, bucketState(now+600000, 600000, 0)},
		{"short form that may have an override", floodgate.TokenBucket(10, time.Second, 10), rawBucket(3, float64(now+500000), 700000, 0), 4, bucketState(now+600000, 600000, 0)},
		{"long form that may have an override", floodgate.TokenBucket(3, time.Second, 3), rawBucket(4, float64(now+333333), 333333, 0, 2, 3, 0), 0, bucketState(now+666667, 666667, 0)},
		{"short form with an e, on an injected clock", floodgate.TokenBucket(10, time.Second, 10), bucketState(now+500000, 700000, now+9e6), 4, bucketState(now+600000, 600000, 0)},
		{"long form", floodgate.TokenBucket(3, time.Second, 3), bucketState(now+333333, 333333, 0, 2, 3, 0), 0, bucketState(now+666667, 666667, 0)},
		{"decimal short form", floodgate.TokenBucket(10, time.Second, 10), us(500000) + ":700000", 4, bucketState(now+600000, 600000, 0)},
		{"oldest short form", floodgate.TokenBucket(10, time.Second, 10), us(500000), 4, bucketState(now+600000, 600000, 0)},
		{"oldest long form, no fraction", floodgate.TokenBucket(10, time.Second, 10), us(500000) + ":0:10", 4, bucketState(now+600000, 600000, 0)},
		{"fresh, uneven rate", floodgate.TokenBucket(3, time.Second, 3), "", 2, bucketState(now+333333, 333333, 0, 1, 3, 0)},
		{"decimal fraction adds up", floodgate.TokenBucket(3, time.Second, 3), us(333333) + ":333333:2:3:0", 0, bucketState(now+666667, 666667, 0)},
		{"fraction of another rate", floodgate.TokenBucket(10, time.Second, 10), bucketState(now+499999, 499999, 0, 1, 3, 0), 4, bucketState(now+600000, 600000, 0)},
		// The latest charge was 1s after now: the clock stepped back 1s.
		{"clock stepped back", floodgate.TokenBucket(10, time.Second, 10), bucketState(now+1500000, 500000, 0), 4, bucketState(now+1600000, 600000, 0, 0, 10, 1000000)},
		{"decimal, clock stepped back", floodgate.TokenBucket(10, time.Second, 10), us(1500000) + ":500000", 4, bucketState(now+1600000, 600000, 0, 0, 10, 1000000)},
	}
	for _, path := range []string{"fast path", "decide"} {
		for i, tt := range tests {
			t.Run(path+"/"+tt.name, func(t *testing.T) {
				st := newStore(t, client, &redisstore.Options{Prefix: "bs:", Clock: storetest.NewClock(storetest.Base)})
				defer st.Close()
				if path == "decide" {
					st.DisableFastPath()
				}
				key := path + strconv.Itoa(i)
				rkey := "bs:{" + key + "}:0b"
				if tt.before != "" {
					if err := client.Set(ctx, rkey, tt.before, 0).Err(); err != nil {
						t.Fatal(err)
					}
				}
				r, err := limiter(t, st, tt.limit).AllowN(ctx, key, 1)
				if err != nil || !r.Allowed || r.Remaining != tt.remaining {
					t.Fatalf("Take = %+v, %v; want allowed with %d remaining", r, err, tt.remaining)
				}
				want := tt.after
				if path == "decide" {
					// decide.lua does not look for an override: the key
					// may have one (see parseBucket).
					want = string(want[0]+2) + want[1:]
				}
				if got := client.Get(ctx, rkey).Val(); got != want {
					t.Errorf("state %s, want %s", showBucket(got), showBucket(want))
				}
			})
		}
	}
}

// TestWindowState checks the forms of a fixed window's state through both
// scripts: binary, "\5" (no override) or "\6" (may have one) and start,
// end, count, latest charge and skew as doubles, and the decimal forms of
// earlier versions, "start:end:count:last:skew" and "start:end:count",
// which each reads. The fast path writes "\5", decide.lua "\6".
func TestWindowState(t *testing.T) {
	srv := redistest.Start(t)
	client := srv.Client(t)
	ctx := context.Background()
	now := storetest.Base.UnixMicro() // the start of a second
	const sec = 1000000
	dec := func(vs ...int64) string {
		var b []string
		for _, v := range vs {
			b = append(b, strconv.FormatInt(v, 10))
		}
		return strings.Join(b, ":")
	}
	tests := []struct {
		name      string
		before    string // the key's state, "" for none
		remaining int64
		after     string // as the fast path writes it
	}{
		{"fresh", "", 9, windowState(now, now+sec, 1, now, 0)},
		{"binary", windowState(now, now+sec, 4, now, 0), 5, windowState(now, now+sec, 5, now, 0)},
		{"binary that may have an override", rawBucket(6, float64(now), float64(now+sec), 4, float64(now), 0), 5, windowState(now, now+sec, 5, now, 0)},
		{"the window before", windowState(now-sec, now, 7, now-sec/2, 0), 9, windowState(now, now+sec, 1, now, 0)},
		{"decimal", dec(now, now+sec, 4, now, 0), 5, windowState(now, now+sec, 5, now, 0)},
		{"oldest decimal", dec(now, now+sec, 4), 5, windowState(now, now+sec, 5, now, 0)},
		// The latest charge was half a second after now: the clock
		// stepped back, and the key reads on its own time line.
		{"clock stepped back", windowState(now, now+sec, 4, now+sec/2, 0), 5, windowState(now, now+sec, 5, now+sec/2, sec/2)},
		{"decimal, clock stepped back", dec(now, now+sec, 4, now+sec/2, 0), 5, windowState(now, now+sec, 5, now+sec/2, sec/2)},
	}
	for _, path := range []string{"fast path", "decide"} {
		for i, tt := range tests {
			t.Run(path+"/"+tt.name, func(t *testing.T) {
				st := newStore(t, client, &redisstore.Options{Prefix: "ws:", Clock: storetest.NewClock(storetest.Base)})
				defer st.Close()
				if path == "decide" {
					st.DisableFastPath()
				}
				key := path + strconv.Itoa(i)
				rkey := "ws:{" + key + "}:0f"
				if tt.before != "" {
					if err := client.Set(ctx, rkey, tt.before, 0).Err(); err != nil {
						t.Fatal(err)
					}
				}
				r, err := limiter(t, st, floodgate.FixedWindow(10, time.Second)).AllowN(ctx, key, 1)
				if err != nil || !r.Allowed || r.Remaining != tt.remaining {
					t.Fatalf("Take = %+v, %v; want allowed with %d remaining", r, err, tt.remaining)
				}
				want := tt.after
				if path == "decide" {
					want = "\x06" + want[1:] // decide.lua does not look for an override
				}
				if got := client.Get(ctx, rkey).Val(); got != want {
					t.Errorf("state %s, want %s", showBucket(got), showBucket(want))
				}
			})
		}
	}
}

// windowState is a fixed window's state in the binary form that says the
// key has no override (see parseFixed in prelude.lua).
func windowState(start, end, count, last, skew int64) string {
	return rawBucket(5, float64(start), float64(end), float64(count), float64(last), float64(skew))
}

// TestOverrideMarksBucket sets an override on a key whose bucket, or fixed
// window, says it has none (see parseBucket and parseFixed): the next
// decision on the fast path finds the override all the same, and leaves
// the state saying it has none once the override is gone.
func TestOverrideMarksBucket(t *testing.T) {
	srv := redistest.Start(t)
	client := srv.Client(t)
	ctx := context.Background()
	kinds := []struct {
		name         string
		limit, wider floodgate.Limit
		suffix       string
		bare, marked byte
	}{
		{"bucket", floodgate.TokenBucket(1, time.Hour, 3), floodgate.TokenBucket(1, time.Hour, 9), "0b", 1, 3},
		{"window", floodgate.FixedWindow(3, time.Hour), floodgate.FixedWindow(9, time.Hour), "0f", 5, 6},
	}
	for _, kind := range kinds {
		for _, st := range []floodgate.Strategy{floodgate.AsIs, floodgate.Additive, floodgate.ResetUsage} {
			t.Run(kind.name+"/"+fmt.Sprint(st), func(t *testing.T) {
				store := newStore(t, client, &redisstore.Options{Prefix: "om:"})
				lim := limiter(t, store, kind.limit)
				// tag is the state's first byte, 0 when it has none
				// (ResetUsage drops it): the fast path then looks too.
				tag := func() byte {
					raw := client.Get(ctx, "om:{k}:"+kind.suffix).Val()
					if raw == "" {
						return 0
					}
					return raw[0]
				}
				client.Del(ctx, "om:{k}:"+kind.suffix, "om:{k}:o")
				if r, err := lim.Allow(ctx, "k"); err != nil || !r.Allowed || r.Quota != 3 {
					t.Fatalf("before the override: %+v, %v", r, err)
				}
				if b := tag(); b != kind.bare {
					t.Fatalf("state's form %d before the override, want %d (no override)", b, kind.bare)
				}
				if err := lim.SetOverride(ctx, "k", floodgate.Override{Limits: []floodgate.Limit{kind.wider}}, st); err != nil {
					t.Fatal(err)
				}
				if b := tag(); b != kind.marked && (b != 0 || st != floodgate.ResetUsage) {
					t.Fatalf("state's form %d after the override, want %d (may have one)", b, kind.marked)
				}
				if r, err := lim.Allow(ctx, "k"); err != nil || !r.Allowed || r.Quota != 9 {
					t.Fatalf("with the override: %+v, %v; want its quota, 9", r, err)
				}
				if b := tag(); b != kind.marked {
					t.Fatalf("state's form %d with the override, want %d", b, kind.marked)
				}
				if err := lim.DeleteOverride(ctx, "k", floodgate.AsIs); err != nil {
					t.Fatal(err)
				}
				if r, err := lim.Allow(ctx, "k"); err != nil || !r.Allowed || r.Quota != 3 {
					t.Fatalf("after the override: %+v, %v; want the limit's quota, 3", r, err)
				}
				if b := tag(); b != kind.bare {
					t.Fatalf("state's form %d after the override, want %d", b, kind.bare)
				}
			})
		}
	}
}

// TestRefundKeepsWindowKey empties a fixed window with a refund, then
// charges it again: the key keeps its state until the window ends. A
// refund that leaves the count at 0 makes the limit full at once (reset
// 0), and decide.lua gave the key an expiry of 1ms; the fast path keeps a
// window key's expiry for later charges in the same window, so those
// charges vanished a millisecond later and the window admitted them
// again (found by TestOverrideMarksBucket on a loaded machine, where a
// carry's refund did the same).
func TestRefundKeepsWindowKey(t *testing.T) {
	srv := redistest.Start(t)
	client, admin := srv.Client(t), srv.Admin(t)
	ctx := context.Background()
	lim := limiter(t, newStore(t, client, &redisstore.Options{Prefix: "rk:"}), floodgate.FixedWindow(3, time.Hour))
	key := "rk:{k}:0f"
	// least is the least expiry the key must have: the time left in the
	// window on the server's clock, up to a second.
	least := func() time.Duration {
		now, err := client.Time(ctx).Result()
		if err != nil {
			t.Fatal(err)
		}
		return min(now.Truncate(time.Hour).Add(time.Hour).Sub(now)/2, time.Second)
	}
	for i, step := range []struct {
		name string
		do   func() (floodgate.Result, error)
	}{
		{"allow", func() (floodgate.Result, error) { return lim.Allow(ctx, "k") }},
		{"refund to 0", func() (floodgate.Result, error) { return lim.Refund(ctx, "k", 1) }},
		{"allow again", func() (floodgate.Result, error) { return lim.Allow(ctx, "k") }},
		{"allow once more", func() (floodgate.Result, error) { return lim.Allow(ctx, "k") }},
	} {
		if _, err := step.do(); err != nil {
			t.Fatalf("%s: %v", step.name, err)
		}
		if ttl, l := admin.PTTL(ctx, key).Val(), least(); ttl < l {
			t.Fatalf("after %s (step %d): the key expires in %v, before its window ends (want %v at least)", step.name, i, ttl, l)
		}
	}
	if r, err := lim.Peek(ctx, "k"); err != nil || r.Remaining != 1 {
		t.Fatalf("after a refund and two charges: %+v, %v; want 1 remaining", r, err)
	}
}

// bucketState is a bucket's state in the binary form (see parseBucket in
// prelude.lua): tat, d and e, then f, R and skew if given.
func bucketState(tat, d, e int64, long ...int64) string {
	vs := []float64{float64(tat), float64(d), float64(e)}
	for _, v := range long {
		vs = append(vs, float64(v))
	}
	if len(long) > 0 {
		return rawBucket(2, vs...)
	}
	return rawBucket(1, vs...)
}

// rawBucket is a binary bucket state of the given form holding vs,
// whatever they are.
func rawBucket(form byte, vs ...float64) string {
	b := []byte{form}
	for _, v := range vs {
		b = binary.BigEndian.AppendUint64(b, math.Float64bits(v))
	}
	return string(b)
}

// showBucket shows a binary bucket or window state as its numbers.
func showBucket(s string) string {
	if len(s) != 25 && len(s) != 49 && len(s) != 41 {
		return strconv.Quote(s)
	}
	out := fmt.Sprintf("form %d:", s[0])
	for i := 1; i < len(s); i += 8 {
		out += fmt.Sprintf(" %d", int64(math.Float64frombits(binary.BigEndian.Uint64([]byte(s[i:i+8])))))
	}
	return out
}

// timedTake takes 1 on lim's key "k", which must be allowed (take i of a
// test), and returns the server's clock (µs) just before and just after
// it: the decision was made between the two, on that clock.
func timedTake(t *testing.T, client *redis.Client, lim *floodgate.Limiter, i int) (before int64, r floodgate.Result, after int64) {
	t.Helper()
	ctx := context.Background()
	t0, err := client.Time(ctx).Result()
	if err != nil {
		t.Fatal(err)
	}
	r, err = lim.Allow(ctx, "k")
	if err != nil || !r.Allowed {
		t.Fatalf("take %d = %+v, %v", i, r, err)
	}
	t1, err := client.Time(ctx).Result()
	if err != nil {
		t.Fatal(err)
	}
	return t0.UnixMicro(), r, t1.UnixMicro()
}

// TestBucketExpiry follows a bucket's key on the server's clock through
// the fast path: every charge leaves it an expiry no earlier than its
// reset, a quarter or a second after it at most, and a charge that the
// key's expiry already covers keeps it rather than setting another.
func TestBucketExpiry(t *testing.T) {
	srv := redistest.Start(t)
	client, admin := srv.Client(t), srv.Admin(t)
	ctx := context.Background()
	st := newStore(t, client, &redisstore.Options{Prefix: "be:"})
	lim := limiter(t, st, floodgate.TokenBucket(10, time.Second, 10))
	var e0 int64
	for i := range 10 {
		before, r, after := timedTake(t, client, lim, i)
		// The decision was made between before and after, on that clock.
		at := admin.PExpireTime(ctx, "be:{k}:0b").Val().Microseconds()
		slack := max(time.Second, r.ResetAfter/4).Microseconds()
		reset := r.ResetAfter.Microseconds()
		if at < before+reset || at > after+reset+slack+1000 {
			t.Fatalf("take %d: expires %dµs after the decision began, want from its reset %dµs to %dµs more", i, at-before, reset, slack)
		}
		raw := client.Get(ctx, "be:{k}:0b").Val()
		if len(raw) != 25 || raw[0] != 1 {
			t.Fatalf("take %d: state %s, want the short binary form", i, showBucket(raw))
		}
		e := int64(math.Float64frombits(binary.BigEndian.Uint64([]byte(raw[17:25]))))
		switch {
		case i == 0:
			// A fresh key: its expiry is the reset, 100ms, and a second.
			if at < before+1100000-1000 {
				t.Fatalf("first take: expires %dµs after the decision began, want the reset and a second", at-before)
			}
			e0 = e
		case before+r.ResetAfter.Microseconds()+200000 <= e0:
			// The first expiry covers this charge by far: it is kept.
			if e != e0 {
				t.Errorf("take %d: e %d, want the first %d kept", i, e, e0)
			}
		}
	}
}

// TestWindowExpiry follows a fixed window's key on the server's clock
// through the fast path: its first charge sets an expiry from the
// window's end to a quarter of the window (or a second) after it, and
// later charges in the window keep it.
func TestWindowExpiry(t *testing.T) {
	srv := redistest.Start(t)
	client, admin := srv.Client(t), srv.Admin(t)
	ctx := context.Background()
	st := newStore(t, client, &redisstore.Options{Prefix: "we:"})
	lim := limiter(t, st, floodgate.FixedWindow(100, time.Hour))
	var first int64
	for i := range 3 {
		before, r, after := timedTake(t, client, lim, i)
		at := admin.PExpireTime(ctx, "we:{k}:0f").Val().Microseconds()
		end := r.ResetAfter.Microseconds() // from the decision, between before and after
		if at < before+end || at > after+end+(15*time.Minute).Microseconds()+1000 {
			t.Fatalf("take %d: expires %dµs after the decision began, want from the window's end, %dµs, to 15 minutes more", i, at-before, end)
		}
		if raw := client.Get(ctx, "we:{k}:0f").Val(); len(raw) != 41 || raw[0] != 5 {
			t.Fatalf("take %d: state %s, want the binary form without an override", i, showBucket(raw))
		}
		if i == 0 {
			first = at
		} else if r.Remaining == 100-int64(i)-1 && at != first {
			// Still the first window (an hour's, rarely crossed here).
			t.Errorf("take %d: expiry moved by %dµs, want the first kept", i, at-first)
		}
	}
}

func TestErrorsAreWrapped(t *testing.T) {
	srv := redistest.Start(t)
	client := srv.Client(t)
	st := newStore(t, client, nil)
	limits := []floodgate.Limit{floodgate.PerSecond(1)}
	lim := limiter(t, st, limits...)
	// A cancelled context is the caller's, not a store failure.
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := lim.AllowN(ctx, "k", 1); !errors.Is(err, context.Canceled) || errors.Is(err, floodgate.ErrStore) {
		t.Errorf("Take with a cancelled context = %v, want context.Canceled only", err)
	}
	// A dead server is a store failure, never a denial.
	srv.Stop()
	r, err := lim.AllowN(context.Background(), "k", 1)
	if !errors.Is(err, floodgate.ErrStore) {
		t.Errorf("Take on a stopped server = %+v, %v; want ErrStore", r, err)
	}
	if err := st.Close(); err != nil {
		t.Fatal(err)
	}
	if err := st.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := lim.AllowN(context.Background(), "k", 1); !errors.Is(err, floodgate.ErrClosed) {
		t.Errorf("Take after Close = %v", err)
	}
}

// TestScriptReloaded flushes the script cache between decisions: go-redis
// answers NOSCRIPT by sending the script again.
func TestScriptReloaded(t *testing.T) {
	srv := redistest.Start(t)
	client, admin := srv.Client(t), srv.Admin(t)
	st := newStore(t, client, nil)
	limits := []floodgate.Limit{floodgate.PerMinute(10)}
	lim := limiter(t, st, limits...)
	ctx := context.Background()
	for i := 0; i < 3; i++ {
		r, err := lim.AllowN(ctx, "k", 1)
		if err != nil || r.Remaining != int64(9-i) {
			t.Fatalf("decision %d after SCRIPT FLUSH: %+v, %v", i, r, err)
		}
		if err := admin.ScriptFlush(ctx).Err(); err != nil {
			t.Fatal(err)
		}
	}
}

// TestKeyErrors: an ACL that refuses one key's Redis keys fails that
// key's decisions with ErrKey and Redis's NOPERM, whether Redis refuses
// the script call or a command in it, and never says "wrong type"; the
// other keys are decided. A server that is down is a store failure, not a
// key's.
func TestKeyErrors(t *testing.T) {
	srv := redistest.Start(t)
	admin := srv.Admin(t)
	ctx := context.Background()
	tests := []struct {
		name, keys string // the ACL user's key pattern
		good, bad  string // keys it may and may not use
	}{
		// The script call names the state keys: Redis refuses it.
		{"call refused", "~acl1:{ok*", "ok1", "bad"},
		// The state keys are allowed, the override key that the script
		// reads is not: Redis refuses the GET in the script.
		{"command in the script refused", "~acl2:{ok*  ~acl2:{bad}:0*", "ok1", "bad"},
	}
	policies := [][]floodgate.Limit{
		{floodgate.PerMinute(3)}, // the fast path
		{floodgate.PerMinute(3), floodgate.FixedWindow(10, time.Minute)}, // decide.lua
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			user := fmt.Sprint("u", i)
			rules := []any{"ACL", "SETUSER", user, "reset", "on", ">pw", "+@all"}
			for _, r := range strings.Fields(tt.keys) {
				rules = append(rules, r)
			}
			if err := admin.Do(ctx, rules...).Err(); err != nil {
				t.Fatal(err)
			}
			client := redis.NewClient(&redis.Options{Addr: srv.Addr, Username: user, Password: "pw"})
			defer client.Close()
			st := newStore(t, client, &redisstore.Options{Prefix: fmt.Sprintf("acl%d:", i+1)})
			for _, limits := range policies {
				lim := limiter(t, st, limits...)
				if _, err := lim.AllowN(ctx, tt.good, 1); err != nil {
					t.Fatalf("%d limits, key %q: %v", len(limits), tt.good, err)
				}
				_, err := lim.AllowN(ctx, tt.bad, 1)
				if !errors.Is(err, floodgate.ErrKey) || !strings.Contains(err.Error(), "redis: NOPERM") ||
					strings.Contains(err.Error(), "wrong type") {
					t.Fatalf("%d limits, key %q: %v; want ErrKey with redis: NOPERM", len(limits), tt.bad, err)
				}
			}
			// A refused key is that key's failure, not a refusal of
			// functions: the store still calls them.
			if err := admin.ConfigResetStat(ctx).Err(); err != nil {
				t.Fatal(err)
			}
			if _, err := limiter(t, st, policies[0]...).AllowN(ctx, tt.good, 1); err != nil {
				t.Fatal(err)
			}
			if info := admin.Info(ctx, "commandstats").Val(); strings.Contains(info, "cmdstat_evalsha:") || !strings.Contains(info, "cmdstat_fcall:") {
				t.Fatalf("after a refused key, the store no longer calls functions; commandstats:\n%s", info)
			}
		})
	}
	t.Run("batch", func(t *testing.T) {
		// Redis refuses a batch's whole call for the one key it may not
		// use: the other keys of the batch are decided all the same.
		if err := admin.Do(ctx, "ACL", "SETUSER", "ub", "reset", "on", ">pw", "+@all", "~aclb:{ok*").Err(); err != nil {
			t.Fatal(err)
		}
		client := redis.NewClient(&redis.Options{Addr: srv.Addr, Username: "ub", Password: "pw"})
		defer client.Close()
		st := newStore(t, client, &redisstore.Options{Prefix: "aclb:"})
		bucket, err := core.NewBucket("bucket", 1, time.Hour, 3, "burst")
		if err != nil {
			t.Fatal(err)
		}
		window, err := core.NewWindow(core.Fixed, "window", 10, time.Hour)
		if err != nil {
			t.Fatal(err)
		}
		for _, limits := range [][]core.Spec{{bucket}, {bucket, window}} { // the fast path, decide.lua
			pol, err := st.Prepare(limits)
			if err != nil {
				t.Fatal(err)
			}
			keys := []string{"ok1", "bad", "ok2", "ok3"}
			ds, errs := st.TakeBatch(ctx, pol, keys, 1)
			for i, k := range keys {
				if k == "bad" {
					if !errors.Is(errs[i], floodgate.ErrKey) || !strings.Contains(errs[i].Error(), "redis: NOPERM") {
						t.Errorf("%d limits, %s: %v; want ErrKey with NOPERM", len(limits), k, errs[i])
					}
				} else if errs[i] != nil || !ds[i].Allowed {
					t.Errorf("%d limits, %s: %+v, %v; want allowed", len(limits), k, ds[i], errs[i])
				}
			}
		}
	})
	t.Run("server down", func(t *testing.T) {
		down := redistest.Start(t)
		client := redis.NewClient(&redis.Options{Addr: down.Addr, MaxRetries: -1})
		defer client.Close()
		st := newStore(t, client, nil)
		lim := limiter(t, st, floodgate.PerMinute(3))
		down.Stop()
		_, err := lim.AllowN(ctx, "k", 1)
		if !errors.Is(err, floodgate.ErrStore) || errors.Is(err, floodgate.ErrKey) {
			t.Fatalf("err = %v; want ErrStore, not ErrKey", err)
		}
	})
}

// TestFunctions checks the Redis function library, for the fast path (one
// bucket limit), decide.lua (two limits) and slots.lua (a concurrency
// limit): loaded on first use, reloaded
// after FUNCTION FLUSH, and replaced by scripts where an ACL refuses
// FUNCTION LOAD or FCALL, or where functions are disabled; the decisions
// are the same in every case, and FCALL decides them all while the library
// is there.
func TestFunctions(t *testing.T) {
	srv := redistest.Start(t)
	admin := srv.Admin(t)
	ctx := context.Background()
	tests := []struct {
		name    string
		acl     string // the rules of the store's user, or "" for the default user
		disable bool
		flush   bool // FUNCTION FLUSH between decisions
		loaded  bool // the library is on the server afterwards
	}{
		{name: "default", loaded: true},
		{name: "flushed", flush: true, loaded: true},
		{name: "no FUNCTION", acl: "+@all -function"},
		{name: "no FCALL", acl: "+@all -fcall"},
		{name: "disabled", disable: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if err := admin.FunctionFlush(ctx).Err(); err != nil {
				t.Fatal(err)
			}
			client := admin
			if tt.acl != "" {
				rules := []interface{}{"ACL", "SETUSER", "lim", "reset", "on", ">pw", "~*", "&*"}
				for _, r := range strings.Fields(tt.acl) {
					rules = append(rules, r)
				}
				if err := admin.Do(ctx, rules...).Err(); err != nil {
					t.Fatal(err)
				}
				client = redis.NewClient(&redis.Options{Addr: srv.Addr, Username: "lim", Password: "pw"})
				defer client.Close()
			}
			st := newStore(t, client, &redisstore.Options{Prefix: tt.name + ":", DisableFunctions: tt.disable})
			defer st.Close()
			if err := admin.ConfigResetStat(ctx).Err(); err != nil {
				t.Fatal(err)
			}
			policies := [][]floodgate.Limit{
				{floodgate.PerMinute(3)}, // the fast path
				{floodgate.PerMinute(3), floodgate.FixedWindow(10, time.Minute)}, // decide.lua
			}
			decisions := 0
			for p, limits := range policies {
				lim := limiter(t, st, limits...)
				for i := range 4 {
					r, err := lim.AllowN(ctx, fmt.Sprint("k", p), 1)
					decisions++
					if err != nil {
						t.Fatalf("%d limits, decision %d: %v", len(limits), i, err)
					}
					if want := i < 3; r.Allowed != want || r.Remaining != max(0, int64(2-i)) {
						t.Fatalf("%d limits, decision %d: %+v, want allowed %v", len(limits), i, r, want)
					}
					if tt.flush {
						if err := admin.FunctionFlush(ctx).Err(); err != nil {
							t.Fatal(err)
						}
					}
				}
				if tt.flush {
					// Flushed after the last decision: one more loads it again.
					if _, err := lim.AllowN(ctx, fmt.Sprint("other", p), 1); err != nil {
						t.Fatal(err)
					}
					decisions++
				}
			}
			// Concurrency limits' slots.lua: one call per operation.
			conc, err := floodgate.NewConcurrency(st, 2, time.Minute, nil)
			if err != nil {
				t.Fatal(err)
			}
			var permits []floodgate.Permit
			for i := range 3 {
				r, err := conc.Acquire(ctx, "slots")
				decisions++
				if err != nil || r.Allowed != (i < 2) || r.Held != min(int64(i+1), 2) {
					t.Fatalf("acquire %d: %+v, %v", i, r, err)
				}
				if r.Allowed {
					permits = append(permits, r.Permit)
				}
				if tt.flush {
					if err := admin.FunctionFlush(ctx).Err(); err != nil {
						t.Fatal(err)
					}
				}
			}
			for i, p := range permits {
				r, err := conc.Release(ctx, p)
				decisions++
				if err != nil || !r.Allowed || r.Held != int64(1-i) {
					t.Fatalf("release %d: %+v, %v", i, r, err)
				}
			}
			if tt.loaded {
				// Each decision is one FCALL that ran (calls that found a
				// flushed library gone count as failed).
				info := admin.Info(ctx, "commandstats").Val()
				var calls, usec, failed, rejected int
				var perCall float64
				i := strings.Index(info, "cmdstat_fcall:")
				if i < 0 {
					t.Fatalf("no FCALL; commandstats:\n%s", info)
				}
				fmt.Sscanf(info[i:], "cmdstat_fcall:calls=%d,usec=%d,usec_per_call=%f,rejected_calls=%d,failed_calls=%d",
					&calls, &usec, &perCall, &rejected, &failed)
				if calls-failed != decisions {
					t.Fatalf("%d FCALLs ran for %d decisions; commandstats:\n%s", calls-failed, decisions, info)
				}
				if strings.Contains(info, "cmdstat_evalsha:") {
					t.Fatalf("EVALSHA ran with the library loaded; commandstats:\n%s", info)
				}
			}
			libs, err := admin.FunctionList(ctx, redis.FunctionListQuery{LibraryNamePattern: "floodgate_*"}).Result()
			if err != nil {
				t.Fatal(err)
			}
			if loaded := len(libs) == 1; loaded != tt.loaded {
				t.Fatalf("libraries on the server: %+v, want loaded %v", libs, tt.loaded)
			}
		})
	}
}

// TestLibraryLoadWithMasterDown: a master that answers that the library
// is missing gets it loaded on every master, and when another master is
// down, so that the load fails, the call runs as a script there instead
// of failing, for a decision and for a concurrency limit's operation.
func TestLibraryLoadWithMasterDown(t *testing.T) {
	cluster := redistest.StartCluster(t, 3)
	ctx := context.Background()
	admin := cluster.Admin(t)
	st := newStore(t, cluster.Client(t), &redisstore.Options{Prefix: "down:", DisableBatching: true})
	defer st.Close()
	lim := limiter(t, st, floodgate.PerMinute(3))
	conc, err := floodgate.NewConcurrency(st, 2, time.Minute, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := lim.AllowN(ctx, "k", 1); err != nil { // loads the library everywhere
		t.Fatal(err)
	}
	node, err := admin.MasterForKey(ctx, "down:{k}")
	if err != nil {
		t.Fatal(err)
	}
	up := node.Options().Addr
	for i, a := range cluster.Addrs[:3] {
		if a != up {
			cluster.Servers[i].Kill()
			break
		}
	}
	if err := node.FunctionFlush(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	r, err := lim.AllowN(ctx, "k", 1)
	if err != nil || !r.Allowed || r.Remaining != 1 {
		t.Fatalf("decision with the library gone and another master down: %+v, %v", r, err)
	}
	if err := node.FunctionFlush(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	a, err := conc.Acquire(ctx, "k")
	if err != nil || !a.Allowed || a.Held != 1 {
		t.Fatalf("acquire with the library gone and another master down: %+v, %v", a, err)
	}
}

// TestFunctionFlushUnderLoad flushes the function library again and again
// while 16 goroutines decide on 8 keys, so that single calls and batches
// find it gone: no decision fails, and every key admits exactly its burst.
func TestFunctionFlushUnderLoad(t *testing.T) {
	srv := redistest.Start(t)
	client, admin := srv.Client(t), srv.Admin(t)
	ctx := context.Background()
	st := newStore(t, client, &redisstore.Options{Prefix: "ffl:", MaxInflight: 1})
	defer st.Close()
	limits := []floodgate.Limit{floodgate.TokenBucket(1, time.Hour, 20)}
	lim := limiter(t, st, limits...)
	const workers, tries, keys = 16, 50, 8
	var admitted [keys]atomic.Int64
	hammer(t, workers, tries, func(w, i int) error {
		if w == 0 && i%5 == 0 {
			if err := admin.FunctionFlush(ctx).Err(); err != nil {
				return err
			}
		}
		k := (w + i) % keys
		r, err := lim.AllowN(ctx, "k"+strconv.Itoa(k), 1)
		if err != nil {
			return err
		}
		if r.Allowed {
			admitted[k].Add(1)
		}
		return nil
	})
	for k := range admitted {
		if n := admitted[k].Load(); n != 20 {
			t.Errorf("key %d admitted %d, want 20", k, n)
		}
	}
}

func TestNewFromURL(t *testing.T) {
	srv := redistest.Start(t, "--requirepass", "s3cret")
	st, err := redisstore.NewFromURL("redis://:s3cret@"+srv.Addr+"/2", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	if _, err := limiter(t, st, floodgate.PerSecond(1)).AllowN(context.Background(), "k", 1); err != nil {
		t.Fatal(err)
	}
	if n, err := redis.NewClient(&redis.Options{Addr: srv.Addr, Password: "s3cret", DB: 2}).DBSize(context.Background()).Result(); err != nil || n != 1 {
		t.Fatalf("db 2 holds %d keys (%v), want 1", n, err)
	}
	if _, err := redisstore.NewFromURL("redis+sentinel://127.0.0.1:1/0", nil); err == nil || !strings.Contains(err.Error(), "master_name") {
		t.Errorf("a sentinel URL without master_name: %v", err)
	}
	if _, err := redisstore.NewFromURL("http://nope", nil); err == nil {
		t.Fatal("NewFromURL accepted an http URL")
	}
}

// TestAccuracyUnderConcurrency hammers one key from many connections for
// two seconds of real time: the store must admit no more than burst +
// rate*elapsed on the server's clock, and as many as an exact limiter
// admits on the same arrivals, within 1%. Each call is replayed through
// floodgate's pure token bucket on a fixed clock, once at the instant it
// started and once at the instant it ended (Redis decided it in between),
// so that a stall of the machine, which leaves the bucket full and its
// overflow lost to any limiter, costs the reference as much as the store.
func TestAccuracyUnderConcurrency(t *testing.T) {
	if testing.Short() {
		t.Skip("takes 2s")
	}
	srv := redistest.Start(t)
	client := redis.NewClient(&redis.Options{Addr: srv.Addr, PoolSize: 32})
	defer client.Close()
	const rate, burst = 2000, 100
	st := newStore(t, client, nil)
	limit := floodgate.TokenBucket(rate, time.Second, burst)
	lim := limiter(t, st, limit)
	ctx := context.Background()
	serverNow := func() time.Time { tm, _ := client.Time(ctx).Result(); return tm }

	// Dial every connection first, so that the measured span is the
	// hammering and not the dialling.
	var warm sync.WaitGroup
	for g := 0; g < 32; g++ {
		warm.Add(1)
		go func() { defer warm.Done(); client.Ping(ctx) }()
	}
	warm.Wait()
	type call struct{ from, to time.Time }
	calls := make([][]call, 32)
	start := serverNow()
	stop := time.Now().Add(2 * time.Second)
	var admitted atomic.Int64
	var wg sync.WaitGroup
	for g := range calls {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for time.Now().Before(stop) {
				from := time.Now()
				r, err := lim.AllowN(ctx, "hot", 1)
				if err != nil {
					t.Error(err)
					return
				}
				calls[g] = append(calls[g], call{from, time.Now()})
				if r.Allowed {
					admitted.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	elapsed := serverNow().Sub(start)
	all := slices.Concat(calls...)
	exact := func(at func(call) time.Time) int64 {
		slices.SortFunc(all, func(a, b call) int { return at(a).Compare(at(b)) })
		e, err := storetest.NewExact(at(all[0]), limit)
		if err != nil {
			t.Fatal(err)
		}
		defer e.Close()
		var n int64
		for _, c := range all {
			if e.Allow("hot", at(c)) {
				n++
			}
		}
		return n
	}
	fromN := exact(func(c call) time.Time { return c.from })
	toN := exact(func(c call) time.Time { return c.to })
	bound := burst + rate*elapsed.Seconds()
	got := admitted.Load()
	t.Logf("%d calls, %d admitted in %s; an exact limiter admits %d at the calls' starts, %d at their ends; bound %.0f",
		len(all), got, elapsed, fromN, toN, bound)
	if float64(got) > bound {
		t.Fatalf("admitted %d, more than the bound %.0f", got, bound)
	}
	if least := 0.99 * float64(min(fromN, toN)); float64(got) < least {
		t.Fatalf("admitted %d, less than 99%% of what an exact limiter admits on the same calls (%d at their starts, %d at their ends)", got, fromN, toN)
	}
}

// TestBatching drives many goroutines over many keys of every algorithm on
// a fixed clock, on a standalone server and on a cluster: every key admits
// exactly its quota, whatever batches the decisions travelled in, and
// batches did form.
func TestBatching(t *testing.T) {
	limits := [][]floodgate.Limit{
		{floodgate.TokenBucket(1, time.Hour, 7)},
		{floodgate.GCRA(6, 1, time.Hour)},
		{floodgate.FixedWindow(7, time.Hour)},
		{floodgate.SlidingLog(7, time.Hour)},
		{floodgate.SlidingWindow(7, time.Hour)},
		{floodgate.PerHour(7), floodgate.FixedWindow(100, time.Hour)},
	}
	clients := map[string]func(t *testing.T) redis.UniversalClient{
		"standalone": func(t *testing.T) redis.UniversalClient { return redistest.Start(t).Client(t) },
		"cluster":    func(t *testing.T) redis.UniversalClient { return redistest.StartCluster(t, 3).Client(t) },
	}
	for name, newClient := range clients {
		t.Run(name, func(t *testing.T) {
			clock := storetest.NewClock(storetest.Base)
			st := newStore(t, newClient(t), &redisstore.Options{Clock: clock})
			defer st.Close()
			const keys, workers, tries = 30, 48, 40
			lims := make([]*floodgate.Limiter, len(limits))
			for i := range limits {
				lims[i] = limiter(t, st, limits[i]...)
			}
			var admitted [keys]atomic.Int64
			hammer(t, workers, tries, func(w, i int) error {
				k := (w*tries + i) % keys
				r, err := lims[k%len(limits)].Allow(context.Background(), fmt.Sprintf("k%d", k))
				if err != nil {
					return err
				}
				if r.Allowed {
					admitted[k].Add(1)
				}
				return nil
			})
			for k := range admitted {
				if got := admitted[k].Load(); got != 7 {
					t.Errorf("key %d (%v): admitted %d, want 7", k, limits[k%len(limits)], got)
				}
			}
			s := st.Stats()
			if s.Decisions != workers*tries || s.ScriptCalls >= s.Decisions {
				t.Errorf("Stats = %+v: want %d decisions in fewer script calls", s, workers*tries)
			}
			t.Logf("%d decisions in %d script calls (%.1f per call)", s.Decisions, s.ScriptCalls, float64(s.Decisions)/float64(s.ScriptCalls))
		})
	}
}

// Callers that stop waiting, and a Close in the middle of the traffic,
// leave no call unanswered and no goroutine behind (TestMain checks):
// a batch whose callers have all left is still sent, and calls queued at
// Close fail with ErrClosed.
func TestBatchCallersLeave(t *testing.T) {
	client := redistest.Start(t).Client(t)
	st := newStore(t, client, &redisstore.Options{Prefix: "cl:", MaxInflight: 1})
	lim := limiter(t, st, floodgate.TokenBucket(1, time.Hour, 1000))
	const workers, tries = 32, 60
	var answered, left, closed atomic.Int64
	hammer(t, workers, tries, func(w, i int) error {
		ctx, cancel := context.WithCancel(context.Background())
		switch {
		case i < 10 || (w+i)%4 == 0:
			// Gone before it is sent, or while it waits; at first
			// every caller, so that whole batches have none.
			cancel()
		case (w+i)%4 == 1:
			go cancel() // gone at some point while it waits
		}
		if w == 0 && i == tries/2 {
			st.Close()
		}
		_, err := lim.Allow(ctx, fmt.Sprintf("k%d", i%7))
		cancel()
		switch {
		case err == nil:
			answered.Add(1)
		case errors.Is(err, context.Canceled):
			left.Add(1)
		case errors.Is(err, floodgate.ErrClosed):
			closed.Add(1)
		default:
			return err
		}
		return nil
	})
	if answered.Load() == 0 || closed.Load() == 0 {
		t.Errorf("%d answered, %d left, %d closed: want some answered before Close and some closed after", answered.Load(), left.Load(), closed.Load())
	}
	t.Logf("%d answered, %d left, %d closed", answered.Load(), left.Load(), closed.Load())
}

// Calls are reused once their callers have their answers, and never while
// a batch still holds one whose caller left: every answer is its own
// caller's. Each worker charges its own key by its own cost, so an answer
// meant for another worker, or written after its caller reused the call,
// shows as a remaining count that its cost does not divide, or one that
// does not go down.
func TestBatchReusedCalls(t *testing.T) {
	client := redistest.Start(t).Client(t)
	st := newStore(t, client, &redisstore.Options{Prefix: "re:"})
	const quota, workers, tries = 1_000_000, 16, 80
	lim := limiter(t, st, floodgate.TokenBucket(1, time.Minute, quota))
	var last [workers]int64 // each worker's remaining after its last answer
	for w := range last {
		last[w] = quota
	}
	hammer(t, workers, tries, func(w, i int) error {
		cost := int64(w + 1)
		ctx, cancel := context.WithCancel(context.Background())
		if i%3 == 0 {
			go cancel() // gone at some point while it waits
		}
		var r floodgate.Result
		var err error
		other := floodgate.Result{Allowed: true, Remaining: quota}
		if i%2 == 0 {
			r, err = lim.AllowN(ctx, fmt.Sprintf("w%d", w), cost)
		} else {
			// A group's calls are reused too: its other member's
			// answer is checked alike.
			g := []floodgate.Request{{Limiter: lim, Key: fmt.Sprintf("w%d", w), N: cost}, {Limiter: lim, Key: fmt.Sprintf("g%d", w), N: cost}}
			err = floodgate.AllowGroup(ctx, g, true)
			r, other = g[0].Result, g[1].Result
		}
		cancel()
		switch {
		case errors.Is(err, context.Canceled):
			return nil
		case err != nil:
			return err
		case !r.Allowed || (quota-r.Remaining)%cost != 0 || r.Remaining >= last[w]:
			return fmt.Errorf("worker %d (cost %d), try %d: %+v after remaining %d", w, cost, i, r, last[w])
		case !other.Allowed || (quota-other.Remaining)%cost != 0:
			return fmt.Errorf("worker %d (cost %d), try %d: the group's other member %+v", w, cost, i, other)
		}
		last[w] = r.Remaining
		return nil
	})
}

// A key holding foreign data fails its own decisions, never the others
// that share its batch.
func TestBatchIsolatesErrors(t *testing.T) {
	srv := redistest.Start(t)
	client := srv.Client(t)
	st := newStore(t, client, &redisstore.Options{Prefix: "iso:"})
	defer st.Close()
	limits := []floodgate.Limit{floodgate.PerSecond(1000)}
	lim := limiter(t, st, limits...)
	if err := client.Set(context.Background(), "iso:{bad}:0b", "not floodgate", 0).Err(); err != nil {
		t.Fatal(err)
	}
	var bad, good, goodErr atomic.Int64
	hammer(t, 32, 20, func(w, i int) error {
		key := fmt.Sprintf("good%d", w)
		if (w+i)%4 == 0 {
			key = "bad"
		}
		_, err := lim.AllowN(context.Background(), key, 1)
		switch {
		case key == "bad" && errors.Is(err, floodgate.ErrStore):
			bad.Add(1)
		case key == "bad":
			return fmt.Errorf("bad key: err = %v", err)
		case err != nil:
			goodErr.Add(1)
		default:
			good.Add(1)
		}
		return nil
	})
	if goodErr.Load() != 0 || bad.Load() != 160 || good.Load() != 480 {
		t.Errorf("bad %d (want 160 errors), good %d (want 480), good with errors %d", bad.Load(), good.Load(), goodErr.Load())
	}
}

// slotOf must agree with the server's CLUSTER KEYSLOT.
func TestSlotOf(t *testing.T) {
	cluster := redistest.StartCluster(t, 3)
	node := redis.NewClient(&redis.Options{Addr: cluster.Addrs[0]})
	defer node.Close()
	for _, key := range []string{"a", "floodgate:{user:42}:0b", "{}x", "x{}y", "{a}{b}", "123456789", "{user1000}.following", "foo{}{bar}", "foo{{bar}}zap"} {
		want, err := node.ClusterKeySlot(context.Background(), key).Result()
		if err != nil {
			t.Fatal(err)
		}
		if got := redisstore.SlotOf(key); int64(got) != want {
			t.Errorf("slotOf(%q) = %d, want %d", key, got, want)
		}
	}
}

// TestDenialCache runs random sequences against two stores on one Redis
// and one fixed clock, one with the denial cache and one without: every
// decision and every RetryAfter must agree, and the cache must answer
// some of them.
func TestDenialCache(t *testing.T) {
	srv := redistest.Start(t)
	client := srv.Client(t)
	tests := []struct {
		limits    []floodgate.Limit
		cacheable bool
	}{
		{[]floodgate.Limit{floodgate.TokenBucket(3, time.Second, 5)}, true},
		{[]floodgate.Limit{floodgate.GCRA(2, 7, time.Second)}, true},
		{[]floodgate.Limit{floodgate.LeakyBucket(4, 1, 300*time.Millisecond)}, true},
		{[]floodgate.Limit{floodgate.FixedWindow(5, time.Second)}, true},
		{[]floodgate.Limit{floodgate.SlidingLog(4, time.Second)}, true},
		{[]floodgate.Limit{floodgate.PerSecond(5), floodgate.FixedWindow(8, 3*time.Second)}, true},
		{[]floodgate.Limit{floodgate.SlidingWindow(5, time.Second)}, false},
	}
	for i, tt := range tests {
		t.Run(tt.limits[0].Algorithm().String(), func(t *testing.T) {
			clock := storetest.NewClock(storetest.Base)
			plain := newStore(t, client, &redisstore.Options{Prefix: fmt.Sprintf("dc%dp:", i), Clock: clock})
			cached := newStore(t, client, &redisstore.Options{Prefix: fmt.Sprintf("dc%dc:", i), Clock: clock, DenialCache: true})
			defer plain.Close()
			defer cached.Close()
			plainLim, cachedLim := limiter(t, plain, tt.limits...), limiter(t, cached, tt.limits...)
			rng := rand.New(rand.NewPCG(uint64(i), 7))
			hits := 0
			for step := range 600 {
				clock.Advance(time.Duration(rng.IntN(60)) * time.Millisecond)
				n := int64(rng.IntN(4))
				if rng.IntN(50) == 0 {
					n = 9 // more than any quota: never
				}
				key := fmt.Sprintf("k%d", rng.IntN(2))
				want, err1 := plainLim.AllowN(context.Background(), key, n)
				got, err2 := cachedLim.AllowN(context.Background(), key, n)
				if err1 != nil || err2 != nil {
					t.Fatal(err1, err2)
				}
				if got.Source == floodgate.SourceCache {
					hits++
					if !tt.cacheable {
						t.Fatalf("step %d: %v answered from the cache", step, tt.limits)
					}
				}
				if got.Allowed != want.Allowed || got.RetryAfter != want.RetryAfter || got.Index != want.Index {
					t.Fatalf("step %d (n=%d, %s): cached %+v, Redis %+v", step, n, key, got, want)
				}
				if got.Source != floodgate.SourceCache && got != want {
					t.Fatalf("step %d: %+v != %+v", step, got, want)
				}
			}
			if tt.cacheable && hits == 0 {
				t.Error("the cache answered nothing")
			}
			t.Logf("%d of 600 answered from the cache", hits)
		})
	}
}

// TestDenialCacheGroups is TestDenialCache for groups (AllowGroup, as an
// Envoy request of several descriptors is decided): random groups, all or
// nothing or not, with forced charges among them, on two stores, one with
// the cache. Every request's answer must agree, and the cache must answer
// some requests of groups that are not all or nothing (and none of the
// others: their denials may come from charges that are given back).
func TestDenialCacheGroups(t *testing.T) {
	client := redistest.Start(t).Client(t)
	clock := storetest.NewClock(storetest.Base)
	plain := newStore(t, client, &redisstore.Options{Prefix: "dgp:", Clock: clock})
	cached := newStore(t, client, &redisstore.Options{Prefix: "dgc:", Clock: clock, DenialCache: true})
	limits := [][]floodgate.Limit{
		{floodgate.TokenBucket(3, time.Second, 5)},
		{floodgate.FixedWindow(4, time.Second)},
		{floodgate.SlidingWindow(5, time.Second)},
	}
	var plainLims, cachedLims []*floodgate.Limiter
	for _, l := range limits {
		plainLims, cachedLims = append(plainLims, limiter(t, plain, l...)), append(cachedLims, limiter(t, cached, l...))
	}
	ctx := context.Background()
	rng := rand.New(rand.NewPCG(11, 7))
	hits := 0
	for step := range 800 {
		clock.Advance(time.Duration(rng.IntN(40)) * time.Millisecond)
		all := rng.IntN(3) == 0
		var want, got []floodgate.Request
		for range 1 + rng.IntN(3) {
			l := rng.IntN(len(limits))
			r := floodgate.Request{Key: fmt.Sprintf("k%d", rng.IntN(2)), N: int64(1 + rng.IntN(3)), Force: rng.IntN(8) == 0}
			r.Limiter = plainLims[l]
			want = append(want, r)
			r.Limiter = cachedLims[l]
			got = append(got, r)
		}
		if err := floodgate.AllowGroup(ctx, want, all); err != nil {
			t.Fatal(err)
		}
		if err := floodgate.AllowGroup(ctx, got, all); err != nil {
			t.Fatal(err)
		}
		for i := range got {
			g, w := got[i].Result, want[i].Result
			if g.Source == floodgate.SourceCache {
				hits++
				if all {
					t.Fatalf("step %d: request %d of an all-or-nothing group answered from the cache", step, i)
				}
			}
			if g.Allowed != w.Allowed || g.RetryAfter != w.RetryAfter || g.Index != w.Index {
				t.Fatalf("step %d (all %v), request %d (%s, n=%d): cached %+v, Redis %+v", step, all, i, got[i].Key, got[i].N, g, w)
			}
		}
	}
	if hits == 0 {
		t.Error("the cache answered nothing")
	}
	t.Logf("%d requests answered from the cache", hits)
}

// newStore returns a Store on client that is closed when t ends.
func newStore(t testing.TB, client redis.UniversalClient, opts *redisstore.Options) *redisstore.Store {
	st := redisstore.New(client, opts)
	t.Cleanup(func() { st.Close() })
	return st
}

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

var limiter = storetest.Limiter

// Through Sentinel: NewFromURL finds the master, and after a failover
// (SENTINEL FAILOVER, then a SIGKILL of the old master) a fallback store in
// front of it answers every call, and decisions come from Redis again.
func TestSentinel(t *testing.T) {
	rig := redistest.StartSentinel(t)
	st, err := redisstore.NewFromURL(rig.URL(), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	fb := fallback.New(st, &fallback.Options{Budget: 200 * time.Millisecond, ProbeInterval: 50 * time.Millisecond, Logger: slog.New(slog.DiscardHandler)})
	defer fb.Close()
	limit := floodgate.TokenBucket(100, time.Second, 100)
	lim := limiter(t, fb, limit)
	ctx := context.Background()
	if r, err := lim.Allow(ctx, "k"); err != nil || !r.Allowed || r.Source != floodgate.SourceStore {
		t.Fatalf("through Sentinel: %+v, %v", r, err)
	}
	if n := rig.Master.Client(t).Exists(ctx, "floodgate:{k}:0b").Val(); n != 1 {
		t.Fatal("the decision did not reach the master")
	}

	// Under load: 8 callers on the key, each every 2ms.
	load := storetest.StartLoad(8, 2*time.Millisecond, func() (floodgate.Result, error) { return lim.Allow(ctx, "k") })
	time.Sleep(300 * time.Millisecond)
	rig.Failover(t)
	promoted := time.Now()
	var back time.Duration
	for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline) && back == 0; time.Sleep(5 * time.Millisecond) {
		if a, ok := load.Last(); ok && a.Result.Source == floodgate.SourceStore && a.At.After(promoted) {
			back = a.At.Sub(promoted)
		}
	}
	time.Sleep(500 * time.Millisecond)
	arrivals, errs := load.Stop()
	admitted, want, _, err := storetest.Compare(arrivals, "k", limit)
	if err != nil {
		t.Fatal(err)
	}
	local := 0
	for _, a := range arrivals {
		if a.Result.Source == floodgate.SourceLocal {
			local++
		}
	}
	sw := fb.Stats().Switches
	t.Logf("decisions came from Redis again %s after the promotion; admitted %d, an exact limiter %d (%+d) on %d arrivals; %d answered locally, %d switches, %d errors",
		back.Round(time.Millisecond), admitted, want, admitted-want, len(arrivals), local, sw, len(errs))
	if len(errs) != 0 || back == 0 || back > 10*time.Second {
		t.Fatalf("after the failover: %d errors, back on Redis after %s, want none and within 10s", len(errs), back)
	}
	// The bound of docs/fallback.md: the callers in flight
	// per switch.
	if bound := int(sw/2+1) * 8; admitted-want > bound {
		t.Errorf("admitted %d over the exact %d, more than %d", admitted-want, want, bound)
	}
	if n := rig.Replica.Client(t).Exists(ctx, "floodgate:{k}:0b").Val(); n != 1 {
		t.Error("decisions after the failover did not reach the new master")
	}
}

// After an outage long enough for go-redis's pool to stop dialing (more
// failed dials than its size), decisions come from Redis again by the
// pool's next redial at the latest: it tries once a second, and usually
// the first probe after Redis answers PING already gets through.
func TestRecoveryAfterLongOutage(t *testing.T) {
	srv := redistest.Start(t)
	client, err := redisstore.NewClient("redis://" + srv.Addr + "/0?pool_size=2")
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	st := newStore(t, client, nil)
	fb := fallback.New(st, &fallback.Options{Budget: 50 * time.Millisecond, ProbeInterval: 20 * time.Millisecond,
		HealthInterval: 20 * time.Millisecond, Logger: slog.New(slog.DiscardHandler)})
	defer fb.Close()
	srv.Kill()
	deadline := time.Now().Add(10 * time.Second)
	for fb.State() != fallback.Degraded && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	for probes := fb.Stats().Probes; fb.Stats().Probes < probes+20 && time.Now().Before(deadline); {
		time.Sleep(5 * time.Millisecond) // 20 failed probes: ten times the pool's size
	}
	restart := time.Now()
	srv.Restart(t) // returns once it answers PING
	back := time.Now()
	for fb.State() != fallback.Primary && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	took := time.Since(back)
	t.Logf("restart took %s; decisions go to Redis again %s after it answered PING (%+v)", back.Sub(restart).Round(time.Millisecond), took.Round(time.Millisecond), fb.Stats())
	if fb.State() != fallback.Primary || took > 1200*time.Millisecond {
		t.Fatalf("back on Redis after %s (state %v), want by go-redis's next one-second redial", took, fb.State())
	}
}

// TestPipelinePerMaster sends calls for many slots of one Cluster master
// together, as the batcher sends a master's queued calls: one script call
// across the slots (cross.go), or with that off a pipeline of one per
// slot. Each key
// is admitted exactly its quota over four rounds, for lone buckets and
// fixed windows on the fast path, keys named twice in a round, two limits
// a key, which go through decide.lua beside the pipeline, and a key whose
// override the fast path hands on to decide.lua; and once the master has
// lost its functions (FUNCTION FLUSH), the slots whose script calls found
// none are decided all the same.
func TestPipelinePerMaster(t *testing.T) {
	cluster := redistest.StartCluster(t, 3)
	client := cluster.Client(t)
	ctx := context.Background()
	bw := bucketAndWindow(t) // a quota of 3 each, an hour
	bucket, window := bw[0], bw[1]
	for i, tc := range []struct {
		name  string
		specs []core.Spec
		twice bool // each key twice a round
		flush bool // FUNCTION FLUSH on the master first
		ovr   bool // the first key has an override of two limits, 2 an hour
		slots bool // cross-slot batching off: a script call per slot
	}{
		{"token bucket", []core.Spec{bucket}, false, false, false, false},
		{"fixed window", []core.Spec{window}, false, false, false, false},
		{"keys twice", []core.Spec{bucket}, true, false, false, false},
		{"two limits", []core.Spec{bucket, window}, false, false, false, false},
		{"an override", []core.Spec{bucket}, false, false, true, false},
		{"per slot", []core.Spec{bucket}, false, false, false, true},
		{"per slot, keys twice", []core.Spec{bucket}, true, false, false, true},
		{"per slot, functions flushed", []core.Spec{bucket}, false, true, false, true},
		{"functions flushed", []core.Spec{bucket}, false, true, false, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			st := newStore(t, client, &redisstore.Options{Prefix: fmt.Sprintf("pipe%d:", i)})
			if tc.slots {
				st.DisableCrossSlot()
			}
			pol, err := st.Prepare(tc.specs)
			if err != nil {
				t.Fatal(err)
			}
			// Keys of many slots, all on the master of the first.
			master := st.Partition("k0")
			var keys []string
			for j := 0; len(keys) < 24; j++ {
				if k := fmt.Sprintf("k%d", j); st.Partition(k) == master {
					keys = append(keys, k)
				}
			}
			if master == "" || len(slotsOf(keys)) < 16 {
				t.Fatalf("master %q, keys in %d slots: want many slots on one master", master, len(slotsOf(keys)))
			}
			if tc.twice {
				keys = append(keys, keys...)
			}
			want := map[string]int{}
			for _, k := range keys {
				want[k] = 3 // the quota
			}
			if tc.ovr {
				lim := limiter(t, st, floodgate.TokenBucket(1, time.Hour, 3))
				two := []floodgate.Limit{floodgate.TokenBucket(1, time.Hour, 2), floodgate.FixedWindow(9, time.Hour)}
				if err := lim.SetOverride(ctx, keys[0], floodgate.Override{Limits: two}, floodgate.AsIs); err != nil {
					t.Fatal(err)
				}
				want[keys[0]] = 2
			}
			// A decision of its own first: on a new cluster it loads the
			// functions on every master.
			if _, errs := st.TakePipeline(ctx, pol, []string{"warm-up"}, 1); errs[0] != nil {
				t.Fatal(errs[0])
			}
			var flushed *redis.Client
			if tc.flush {
				for _, s := range cluster.Servers {
					if s.Addr == master {
						flushed = s.Admin(t)
					}
				}
				if err := flushed.FunctionFlush(ctx).Err(); err != nil {
					t.Fatal(err)
				}
				if err := flushed.ConfigResetStat(ctx).Err(); err != nil {
					t.Fatal(err)
				}
			}
			admitted, requests := map[string]int{}, map[string]int{}
			for round := range 4 {
				before := st.Stats()
				ds, errs := st.TakePipeline(ctx, pol, keys, 1)
				after := st.Stats()
				want := 1 // script calls
				if tc.slots {
					want = len(slotsOf(keys))
				}
				if fast := len(tc.specs) == 1 && !tc.flush && !tc.ovr; fast && (after.RoundTrips-before.RoundTrips != 1 || after.ScriptCalls-before.ScriptCalls != uint64(want)) {
					t.Errorf("round %d: %d round trips carried %d script calls, want 1 carrying %d", round,
						after.RoundTrips-before.RoundTrips, after.ScriptCalls-before.ScriptCalls, want)
				}
				for j, k := range keys {
					if errs[j] != nil {
						t.Fatalf("round %d, key %s: %v", round, k, errs[j])
					}
					requests[k]++
					if ds[j].Allowed {
						admitted[k]++
					}
				}
			}
			if flushed != nil {
				// The pipeline's slots found no function: the library was
				// loaded once for them, not once a slot.
				stats, err := flushed.Info(ctx, "commandstats").Result()
				if err != nil {
					t.Fatal(err)
				}
				if !strings.Contains(stats, "cmdstat_function|load:calls=1,") {
					t.Errorf("FUNCTION LOAD on the flushed master, want one call:\n%s", stats)
				}
			}
			for _, k := range keys {
				if admitted[k] != want[k] {
					t.Errorf("key %s admitted %d times in %d requests over four rounds, want %d (its quota)", k, admitted[k], requests[k], want[k])
				}
			}
		})
	}
}

func slotsOf(keys []string) map[int]bool {
	m := map[int]bool{}
	for _, k := range keys {
		m[redisstore.SlotOf(k)] = true
	}
	return m
}
