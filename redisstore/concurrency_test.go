package redisstore_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/floodgate/floodgate"
	"github.com/floodgate/floodgate/internal/testkit/redistest"
	"github.com/floodgate/floodgate/redisstore"
	"github.com/floodgate/floodgate/storetest"
	"github.com/redis/go-redis/v9"
)

func slotsOn(t *testing.T, client redis.UniversalClient, n int64, lease time.Duration, opts *redisstore.Options) (*redisstore.Store, *floodgate.Concurrency) {
	t.Helper()
	if opts == nil {
		opts = &redisstore.Options{}
	}
	if opts.Prefix == "" {
		opts.Prefix = fmt.Sprintf("t%d:", prefixes.Add(1))
	}
	st := newStore(t, client, opts)
	c, err := floodgate.NewConcurrency(st, n, lease, nil)
	if err != nil {
		t.Fatal(err)
	}
	return st, c
}

// TestSlotsOnRedisTime checks the layout in Redis on Redis's own clock: a
// sorted set of the permits, scored by their expiry, which expires with
// its latest permit, and is gone when the last is released.
func TestSlotsOnRedisTime(t *testing.T) {
	srv := redistest.Start(t)
	client, admin := srv.Client(t), srv.Admin(t) // admin looks, under the ACL pass too
	_, c := slotsOn(t, client, 2, 3*time.Second, &redisstore.Options{Prefix: "s:"})
	ctx := context.Background()
	r, err := c.Acquire(ctx, "user:1")
	if err != nil || !r.Allowed {
		t.Fatal(r, err)
	}
	members, err := admin.ZRangeWithScores(ctx, "s:{user:1}:c", 0, -1).Result()
	if err != nil || len(members) != 1 || members[0].Member != r.Permit.ID || int64(members[0].Score) != r.Permit.Expires.UnixMicro() {
		t.Fatalf("the key holds %+v (%v), want the permit %+v", members, err, r.Permit)
	}
	ttl := admin.PTTL(ctx, "s:{user:1}:c").Val()
	if ttl <= 2*time.Second || ttl > 3*time.Second+time.Millisecond {
		t.Errorf("TTL %s, want the lease", ttl)
	}
	srvNow, _ := admin.Time(ctx).Result()
	if d := r.Permit.Expires.Sub(srvNow); d <= 2*time.Second || d > 3*time.Second {
		t.Errorf("the permit expires %s after Redis's now, want the lease", d)
	}
	if rel, err := c.Release(ctx, r.Permit); err != nil || !rel.Allowed || rel.Held != 0 {
		t.Fatal(rel, err)
	}
	if n := admin.Exists(ctx, "s:{user:1}:c").Val(); n != 0 {
		t.Error("the key of no permits is kept")
	}
	// A key with braces goes under a hash tag, as the rate limits' do.
	if r, err := c.Acquire(ctx, "a{b}"); err != nil || !r.Allowed {
		t.Fatal(r, err)
	}
	if keys := admin.Keys(ctx, "s:{*}a{b}:c").Val(); len(keys) != 1 {
		t.Errorf("keys %v", keys)
	}
}

// A key that holds something else fails that key alone, with ErrKey.
func TestSlotsWrongType(t *testing.T) {
	srv := redistest.Start(t)
	_, c := slotsOn(t, srv.Client(t), 2, time.Second, &redisstore.Options{Prefix: "w:"})
	ctx := context.Background()
	srv.Admin(t).Set(ctx, "w:{bad}:c", "x", 0)
	if _, err := c.Acquire(ctx, "bad"); !errors.Is(err, floodgate.ErrKey) {
		t.Fatalf("acquire on a string: %v, want ErrKey", err)
	}
	if r, err := c.Acquire(ctx, "good"); err != nil || !r.Allowed {
		t.Fatal(r, err)
	}
}

// TestSlotsBatched checks that one operation alone is one script call,
// and that goroutines' operations share script calls, never more than
// one each.
func TestSlotsBatched(t *testing.T) {
	for _, tc := range []struct {
		name   string
		client func(t *testing.T) redis.UniversalClient
	}{
		{"standalone", func(t *testing.T) redis.UniversalClient { return redistest.Start(t).Client(t) }},
		{"cluster", func(t *testing.T) redis.UniversalClient { return redistest.StartCluster(t, 3).Client(t) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			st, c := slotsOn(t, tc.client(t), 4, time.Minute, nil)
			ctx := context.Background()
			r, err := c.Acquire(ctx, "k")
			if err != nil || !r.Allowed {
				t.Fatal(r, err)
			}
			if _, err := c.Release(ctx, r.Permit); err != nil {
				t.Fatal(err)
			}
			if s := st.SlotStats(); s.Ops != 2 || s.ScriptCalls != 2 {
				t.Fatalf("alone: %+v, want a script call per operation", s)
			}
			const workers, rounds, keys = 32, 30, 50
			hammer(t, workers, rounds, func(w, i int) error {
				key := fmt.Sprint("k", (w*rounds+i)%keys)
				r, err := c.Acquire(ctx, key)
				if err == nil && r.Allowed {
					_, err = c.Release(ctx, r.Permit)
				}
				return err
			})
			s := st.SlotStats()
			if s.ScriptCalls > s.Ops || s.Ops < workers*rounds {
				t.Fatalf("%+v", s)
			}
			t.Logf("%d operations in %d script calls", s.Ops, s.ScriptCalls)
		})
	}
}

// TestSlotsClusterLibraryFlushed flushes the function library on every
// master while goroutines acquire and release across slots, so that the
// pipelines of per-slot FCALLs find it gone: each such call goes again,
// which loads it, and no operation fails or is lost.
func TestSlotsClusterLibraryFlushed(t *testing.T) {
	cluster := redistest.StartCluster(t, 3)
	admin := cluster.Admin(t)
	st, c := slotsOn(t, cluster.Client(t), 4, time.Minute, nil)
	ctx := context.Background()
	const workers, rounds, keys = 16, 24, 40
	hammer(t, workers, rounds, func(w, i int) error {
		if w == 0 && i%4 == 0 {
			err := admin.ForEachMaster(ctx, func(ctx context.Context, m *redis.Client) error {
				return m.FunctionFlush(ctx).Err()
			})
			if err != nil {
				return err
			}
		}
		key := fmt.Sprint("k", (w*rounds+i)%keys)
		r, err := c.Acquire(ctx, key)
		if err != nil || !r.Allowed {
			return err
		}
		rel, err := c.Release(ctx, r.Permit)
		if err == nil && !rel.Allowed {
			err = fmt.Errorf("release of %s: %+v", key, rel)
		}
		return err
	})
	for k := range keys {
		in, err := c.Inspect(ctx, fmt.Sprint("k", k))
		if err != nil || in.Held != 0 {
			t.Fatalf("k%d: %+v, %v", k, in, err)
		}
	}
	if s := st.SlotStats(); s.Ops < workers*rounds {
		t.Fatalf("%+v", s)
	}
}

// TestSlotsClusterReshardUnderLoad moves 2,000 slots, permits and all,
// from one master to another with redis-cli --cluster reshard while 64
// goroutines acquire and release on 500 keys of a limit of 2: no
// operation fails, no acquire is granted beyond the limit, every release
// of a granted permit gives its slot back, and every key ends with
// nothing held.
func TestSlotsClusterReshardUnderLoad(t *testing.T) {
	cluster := redistest.StartCluster(t, 3)
	st, c := slotsOn(t, cluster.Client(t), 2, time.Minute, nil)
	ctx := context.Background()
	const workers, keys = 64, 500
	stop := make(chan struct{})
	var granted, denied atomic.Int64
	running := func(int) bool {
		select {
		case <-stop:
			return false
		default:
			return true
		}
	}
	wait := goHammer(workers, running, func(w, i int) error {
		key := fmt.Sprint("k", (w+i*workers)*7919%keys)
		r, err := c.Acquire(ctx, key)
		switch {
		case err != nil:
			return fmt.Errorf("acquire on %s: %w", key, err)
		case !r.Allowed:
			denied.Add(1)
			return nil
		case r.Held > 2:
			return fmt.Errorf("acquire on %s: %+v, more than 2 held", key, r)
		}
		granted.Add(1)
		if rel, err := c.Release(ctx, r.Permit); err != nil || !rel.Allowed {
			return fmt.Errorf("release on %s: %+v, %v; want released", key, rel, err)
		}
		return nil
	})
	start := time.Now()
	cluster.Reshard(t, cluster.Addrs[0], cluster.Addrs[1], 2000, 90*time.Second)
	took := time.Since(start)
	close(stop)
	wait(t)
	for k := range keys {
		in, err := c.Inspect(ctx, fmt.Sprint("k", k))
		if err != nil || in.Held != 0 {
			t.Errorf("k%d after the load: %+v, %v; want nothing held", k, in, err)
		}
	}
	s := st.SlotStats()
	t.Logf("2000 slots moved in %s; %d pairs, %d acquires denied; %.2f operations per script call",
		took.Round(time.Millisecond), granted.Load(), denied.Load(), float64(s.Ops)/float64(max(s.ScriptCalls, 1)))
}

// TestSlotsUnderOOM: while Redis is out of memory (maxmemory with
// noeviction), it refuses the library's functions whole, and the store
// runs the script instead, as it did before slots.lua was a function: a
// release, which frees memory, goes through, and an acquire on an empty
// key fails on its ZADD. (An acquire on a key that holds permits runs
// its sweep first, a write, after which Redis lets a script write on.)
func TestSlotsUnderOOM(t *testing.T) {
	srv := redistest.Start(t)
	admin := srv.Admin(t)
	ctx := context.Background()
	_, c := slotsOn(t, srv.Client(t), 2, time.Minute, nil)
	r, err := c.Acquire(ctx, "k")
	if err != nil || !r.Allowed {
		t.Fatal(r, err)
	}
	if err := admin.ConfigSet(ctx, "maxmemory-policy", "noeviction").Err(); err != nil {
		t.Fatal(err)
	}
	if err := admin.ConfigSet(ctx, "maxmemory", "1").Err(); err != nil {
		t.Fatal(err)
	}
	defer admin.ConfigSet(ctx, "maxmemory", "0")
	if a, err := c.Acquire(ctx, "empty"); err == nil || a.Allowed || !strings.Contains(err.Error(), "OOM") {
		t.Fatalf("acquire out of memory: %+v, %v; want Redis's OOM", a, err)
	}
	rel, err := c.Release(ctx, r.Permit)
	if err != nil || !rel.Allowed || rel.Held != 0 {
		t.Fatalf("release out of memory: %+v, %v; want released", rel, err)
	}
}

// Through Sentinel, as through a server.
func TestSlotsSentinel(t *testing.T) {
	rig := redistest.StartSentinel(t)
	st, err := redisstore.NewFromURL(rig.URL(), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	c, err := floodgate.NewConcurrency(st, 1, time.Minute, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	r, err := c.Acquire(ctx, "k")
	if err != nil || !r.Allowed {
		t.Fatal(r, err)
	}
	if r2, err := c.Acquire(ctx, "k"); err != nil || r2.Allowed || r2.Held != 1 {
		t.Fatal(r2, err)
	}
	if n := rig.Master.Client(t).ZCard(ctx, "floodgate:{k}:c").Val(); n != 1 {
		t.Fatalf("the master holds %d permits", n)
	}
	if rel, err := c.Release(ctx, r.Permit); err != nil || !rel.Allowed {
		t.Fatal(rel, err)
	}
}

// FuzzSlots holds the Lua of the concurrency limits to storetest's
// reference model, as FuzzDifferential holds the rate limits' to the Go;
// the memory store has a FuzzSlots of its own. Run longer with
//
//	go test -run - -fuzz FuzzSlots -fuzztime 5m ./redisstore
func FuzzSlots(f *testing.F) {
	client := redistest.Start(f).Client(f)
	f.Add([]byte{2, 10, 0, 0, 8, 0, 0, 8, 0, 0, 8, 1, 0, 8, 2, 0, 20, 1, 1, 8})
	f.Add([]byte{0, 3, 0, 0, 8, 1, 0, 8, 1, 0, 8, 0, 0, 23, 2, 0, 0, 0, 0, 0})
	f.Add([]byte{4, 49, 0, 0, 8, 4, 0, 8, 8, 0, 8, 2, 1, 12, 0, 0, 22, 1, 2, 8, 0, 0, 0})
	f.Fuzz(func(t *testing.T, data []byte) {
		err := storetest.CheckSlotSequence(func(clock floodgate.Clock) floodgate.Store {
			return redisstore.New(client, &redisstore.Options{Prefix: fmt.Sprintf("f%d:", prefixes.Add(1)), Clock: clock})
		}, data)
		if err != nil {
			t.Fatal(err)
		}
	})
}
