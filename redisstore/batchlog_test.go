package redisstore

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/floodgate/floodgate/core"
	"github.com/floodgate/floodgate/internal/testkit/redistest"
	"github.com/redis/go-redis/v9"
)

// TestBatchFit holds the batcher to its budget of sliding-log work per
// script call: calls go out in order, up to maxBatch, and beyond the
// first only while their log work adds up to maxBatchLogWork at most; the
// first goes whatever its own.
func TestBatchFit(t *testing.T) {
	const B = maxBatchLogWork
	tests := []struct {
		name     string
		maxBatch int
		works    []int64 // of the calls queued, in order
		wantK    int
		wantWork int64
	}{
		{"nothing queued", 128, nil, 0, 0},
		{"no logs: maxBatch", 4, []int64{0, 0, 0, 0, 0, 0}, 4, 0},
		{"no logs: all", 128, []int64{0, 0, 0}, 3, 0},
		{"within the budget", 128, []int64{B / 4, B / 4, B / 4}, 3, 3 * B / 4},
		{"exactly the budget", 128, []int64{B / 2, B / 2}, 2, B},
		{"one over the budget waits", 128, []int64{B / 2, B / 2, 1}, 2, B},
		{"a heavy first goes alone", 128, []int64{B + 1, 0, 0}, 1, B + 1},
		{"order: a light call after one that does not fit waits too", 128, []int64{B / 2, B, 0, 0}, 1, B / 2},
		{"calls without logs fill up to the budget", 128, []int64{B, 0, 0, 1}, 3, B},
		{"maxBatch first", 2, []int64{1, 1, 1}, 2, 2},
		{"maxBatch with the budget", 3, []int64{B / 2, B / 2, 0, B}, 3, B},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b := &batcher{maxBatch: tt.maxBatch}
			var queue []*call
			var work int64
			for _, w := range tt.works {
				queue = append(queue, &call{work: w})
				work += w
			}
			k, w := b.fit(queue, work)
			if k != tt.wantK || w != tt.wantWork {
				t.Errorf("fit(%v) = %d calls of work %d, want %d of %d", tt.works, k, w, tt.wantK, tt.wantWork)
			}
		})
	}
}

// TestLogWork checks the sliding-log work counted for a request: members
// it may write, and an eighth of those it may remove (twice each log's
// limit expired, and a refund's); nothing without a log.
func TestLogWork(t *testing.T) {
	st := New(nil, &Options{DisableBatching: true})
	defer st.Close()
	const L = core.MaxLogQuota
	removed := func(n int64) int64 { return (n + 7) / 8 } // rounded up
	prepare := func(specs ...core.Spec) *policy {
		p, err := st.Prepare(specs)
		if err != nil {
			t.Fatal(err)
		}
		return p.(*policy)
	}
	spec := func(kind core.Kind, limit int64) core.Spec {
		var sp core.Spec
		var err error
		if kind == core.Bucket {
			sp, err = core.NewBucket("bucket", limit, time.Second, limit, "burst")
		} else {
			sp, err = core.NewWindow(kind, "window", limit, time.Minute)
		}
		if err != nil {
			t.Fatal(err)
		}
		return sp
	}
	bucket := prepare(spec(core.Bucket, 100))
	window := prepare(spec(core.Bucket, 100), spec(core.Sliding, 1_000_000))
	log := prepare(spec(core.Log, L))
	log10 := prepare(spec(core.Log, 10))
	two := prepare(spec(core.Log, 50), spec(core.Bucket, 5), spec(core.Log, 200))
	tests := []struct {
		name string
		p    *policy
		n    int64
		o    op
		want int64
	}{
		{"bucket", bucket, 1_000_000, opTake, 0},
		{"no log", window, 1_000_000, opCharge, 0},
		{"peek", log, 0, opTake, removed(2 * L)},
		{"take of 1", log, 1, opTake, 1 + removed(2*L)},
		{"take of the limit", log, L, opTake, L + removed(2*L)},
		{"take over the limit", log, 1 << 40, opTake, L + removed(2*L)},
		{"charge over the limit", log, 1 << 40, opCharge, 2*L + removed(2*L)},
		{"refund over the limit", log, 1 << 40, opRefund, removed(2*L + 2*L)},
		{"small log, take of 1", log10, 1, opTake, 1 + removed(20)},
		{"small log, refund of 3", log10, 3, opRefund, removed(20 + 3)},
		{"two logs, take of 100", two, 100, opTake, 200 + removed(2*L)},
		{"two logs, take of 10", two, 10, opTake, 20 + removed(2*L)},
		{"two logs, charge over both", two, 1 << 40, opCharge, 2*L + removed(2*L)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := tt.p.logWork(tt.n, tt.o); got != tt.want {
				t.Errorf("logWork(%d, %d) = %d, want %d", tt.n, tt.o, got, tt.want)
			}
		})
	}
	// A group counts its members'.
	g := &call{group: []*call{{p: log, n: 1}, {p: bucket, n: 1}, {p: log10, n: 1}}, p: bucket}
	if got, want := g.logWork(), log.logWork(1, opTake)+log10.logWork(1, opTake); got != want {
		t.Errorf("a group's logWork = %d, want its members' %d", got, want)
	}
}

// 128 concurrent checks of cost MaxLogQuota on sliding logs of
// MaxLogQuota, each on a key of its own, go to Redis in script calls whose
// log work is within maxBatchLogWork (a few requests each), where they
// all went in one or two calls of about a hundred, which held Redis for
// hundreds of milliseconds. On a Cluster, where a master's queued calls go
// out as one pipeline of a script call per slot, the keys share a slot, so
// that each pipeline is one script call. Every call's decisions are counted from SLOWLOG (numkeys:
// one key per request here); its durations are logged, not asserted, on
// a machine this noisy.
func TestBatchLogWorkBounded(t *testing.T) {
	for _, tt := range []struct {
		name    string
		clients func(t *testing.T) (client, admin redis.UniversalClient)
		oneSlot bool
	}{
		{"standalone", func(t *testing.T) (redis.UniversalClient, redis.UniversalClient) {
			s := redistest.Start(t)
			return s.Client(t), s.Admin(t)
		}, false},
		{"cluster", func(t *testing.T) (redis.UniversalClient, redis.UniversalClient) {
			c := redistest.StartCluster(t, 3)
			return c.Client(t), c.Admin(t)
		}, true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			client, admin := tt.clients(t)
			testBatchLogWorkBounded(t, client, admin, tt.oneSlot)
		})
	}
}

// testBatchLogWorkBounded runs the store on client and reads the slow log
// with admin (the default user: the ACL user may not).
func testBatchLogWorkBounded(t *testing.T, client, admin redis.UniversalClient, oneSlot bool) {
	const calls = 128
	// The keys, and one more to load the scripts with: k0, k1, ..., or on a
	// Cluster the first of those whose slot is k0's (one in 16384).
	keys := make([]string, 0, calls+1)
	for i := 0; len(keys) < calls+1 && i < 1<<26; i++ {
		k := "k" + strconv.Itoa(i)
		if !oneSlot || slotOf("{"+k+"}") == slotOf("{k0}") {
			keys = append(keys, k)
		}
	}
	if len(keys) < calls+1 {
		t.Fatalf("found %d keys of one slot, want %d", len(keys), calls+1)
	}
	L := int64(core.MaxLogQuota)
	ctx := context.Background()
	// Every server (each master of a Cluster) logs every command.
	servers := func(f func(c *redis.Client) error) {
		t.Helper()
		var err error
		if cc, ok := admin.(*redis.ClusterClient); ok {
			err = cc.ForEachMaster(ctx, func(ctx context.Context, c *redis.Client) error { return f(c) })
		} else {
			err = f(admin.(*redis.Client))
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	servers(func(c *redis.Client) error {
		if err := c.ConfigSet(ctx, "slowlog-log-slower-than", "0").Err(); err != nil {
			return err
		}
		return c.ConfigSet(ctx, "slowlog-max-len", "1024").Err()
	})
	// One script call in flight (on a Cluster, masterInflight pipelines):
	// the others queue behind it, and batch.
	st := New(client, &Options{Prefix: "bl:", MaxInflight: 1})
	defer st.Close()
	sp, err := core.NewWindow(core.Log, "log", L, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	pol, err := st.Prepare([]core.Spec{sp})
	if err != nil {
		t.Fatal(err)
	}
	// Load the scripts before the slow log is reset.
	if _, err := pol.Take(ctx, keys[calls], 1); err != nil {
		t.Fatal(err)
	}
	servers(func(c *redis.Client) error { return c.SlowLogReset(ctx).Err() })
	before := st.Stats()
	start := make(chan struct{})
	var wg sync.WaitGroup
	errs := make([]error, calls)
	for i := range calls {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			d, err := pol.Take(ctx, keys[i], L)
			if err == nil && !d.Allowed {
				err = fmt.Errorf("denied: %+v", d)
			}
			errs[i] = err
		}()
	}
	close(start)
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("check %d: %v", i, err)
		}
	}
	var logs []redis.SlowLog
	var mu sync.Mutex
	servers(func(c *redis.Client) error {
		l, err := c.SlowLogGet(ctx, -1).Result()
		mu.Lock()
		logs = append(logs, l...)
		mu.Unlock()
		return err
	})
	each := pol.(*policy).logWork(L, opTake)
	var sizes []int
	var durs []time.Duration
	for _, l := range logs {
		if len(l.Args) < 3 {
			continue
		}
		switch strings.ToLower(l.Args[0]) {
		case "evalsha", "eval", "fcall", "fcall_ro":
		default:
			continue
		}
		k, err := strconv.Atoi(l.Args[2])
		if err != nil {
			t.Fatalf("numkeys of %v: %v", l.Args[:3], err)
		}
		k /= 2 // each check declares its limit's key and its override key
		sizes = append(sizes, k)
		durs = append(durs, l.Duration)
		if k > 1 && int64(k)*each > maxBatchLogWork {
			t.Errorf("a script call carried %d checks, log work %d, over the budget %d", k, int64(k)*each, maxBatchLogWork)
		}
	}
	total := 0
	for _, k := range sizes {
		total += k
	}
	if total != calls {
		t.Fatalf("the slow log holds script calls of %d checks in all, want %d: %v", total, calls, sizes)
	}
	after := st.Stats()
	slices.Sort(durs)
	var sum time.Duration
	for _, d := range durs {
		sum += d
	}
	t.Logf("%d checks in %d script calls (Stats: %d decisions in %d calls), %d each at most (log work %d each, budget %d); script time: longest %v, median %v, all %v",
		calls, len(sizes), after.Decisions-before.Decisions, after.ScriptCalls-before.ScriptCalls, slices.Max(sizes), each, maxBatchLogWork,
		durs[len(durs)-1], durs[len(durs)/2], sum)
}

// A script call that the log budget closes counts as a full batch for the
// room, which lets a call out beside one in flight only with half a
// batch: otherwise calls of a few heavy requests would wait for every
// script call in flight to end, while large batches are the rule.
func TestBatcherNextFull(t *testing.T) {
	const B = maxBatchLogWork
	tests := []struct {
		name     string
		works    []int64
		wantK    int
		wantFull int
		sendable bool // beside the one in flight
	}{
		{"no logs: too few", []int64{0, 0, 0}, 3, 3, false},
		{"within the budget: too few", []int64{1, 1, 1}, 3, 3, false},
		{"closed by the budget", []int64{B / 2, B / 2, B / 2, 0}, 2, 128, true},
		{"closed by maxBatch", make([]int64, 200), 128, 128, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b := &batcher{maxInflight: 8, maxBatch: 128}
			for range 100 {
				b.out(20) // large batches lately
			}
			b.inflight = 1
			for _, w := range tt.works {
				b.pending = append(b.pending, &call{work: w})
				b.work += w
			}
			k, _, full := b.next()
			if k != tt.wantK || full != tt.wantFull {
				t.Fatalf("next() = %d calls, judged as %d; want %d, %d", k, full, tt.wantK, tt.wantFull)
			}
			if got := b.sendable(); got != tt.sendable {
				t.Errorf("sendable() = %v with one in flight, want %v", got, tt.sendable)
			}
		})
	}
}
