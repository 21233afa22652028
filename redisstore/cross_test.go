package redisstore_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"reflect"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/floodgate/floodgate"
	"github.com/floodgate/floodgate/core"
	"github.com/floodgate/floodgate/internal/testkit/redistest"
	"github.com/floodgate/floodgate/internal/testkit/syncbuf"
	"github.com/floodgate/floodgate/redisstore"
	"github.com/floodgate/floodgate/storetest"
	"github.com/redis/go-redis/v9"
)

// TestCrossSlotMovedSlot moves one slot of a master's batch to another
// master behind the client's back, at each step of a migration, and sends
// the batch as one cross-slot script call to the old master: the old
// master refuses that slot whole (Redis 7.0 answers the probe, a missing
// key, with "Script attempted to access a non local key in a cluster
// node" once the slot is migrating or gone), decides the others, and the
// refused slot's request goes again through the per-slot path, which
// follows ASK or MOVED, or, while the slot is migrating, is refused with
// TRYAGAIN uncharged (its call declares its override key, which does not
// exist, beside its state) and sent again until the slot has moved. Every
// key is charged exactly once per round, and no caller sees an error.
func TestCrossSlotMovedSlot(t *testing.T) {
	cluster := redistest.StartCluster(t, 3)
	for i, step := range []string{"migrating, key not moved", "migrating, key moved", "moved"} {
		t.Run(step, func(t *testing.T) {
			ctx := context.Background()
			clock := storetest.NewClock(storetest.Base)
			prefix := fmt.Sprintf("mv%d:", i)
			st := newStore(t, cluster.Client(t), &redisstore.Options{Prefix: prefix, Clock: clock})
			bucket := bucketAndWindow(t)[0] // a quota of 3 an hour
			pol, err := st.Prepare([]core.Spec{bucket})
			if err != nil {
				t.Fatal(err)
			}
			from := st.Partition("k0")
			var keys []string
			for j := 0; len(keys) < 16; j++ {
				if k := "k" + strconv.Itoa(j); st.Partition(k) == from {
					keys = append(keys, k)
				}
			}
			var to string
			admin := map[string]*redis.Client{}
			for _, s := range cluster.Servers {
				admin[s.Addr] = s.Admin(t)
				if s.Addr != from && to == "" {
					to = s.Addr
				}
			}
			round := func(want int64) {
				t.Helper()
				ds, errs := st.TakePipeline(ctx, pol, keys, 1)
				for i, k := range keys {
					if errs[i] != nil || !ds[i].Allowed || ds[i].Remaining != want {
						t.Errorf("key %s: %+v, %v; want allowed, %d remaining", k, ds[i], errs[i], want)
					}
				}
			}
			// tryAgains counts the calls that the cluster's masters
			// refused with TRYAGAIN.
			tryAgains := func() int {
				n := 0
				for _, c := range admin {
					info, err := c.Info(ctx, "errorstats").Result()
					if err != nil {
						t.Fatal(err)
					}
					for _, line := range strings.Split(info, "\r\n") {
						if v, ok := strings.CutPrefix(line, "errorstat_TRYAGAIN:count="); ok {
							c, _ := strconv.Atoi(v)
							n += c
						}
					}
				}
				return n
			}
			round(2)

			// Move the slot of keys[0], with the cli's steps (see
			// redis-cli's clusterManagerMoveSlot).
			slot := redisstore.SlotOf(prefix + "{" + keys[0] + "}:0b")
			fromID, toID := cluster.NodeID(t, from), cluster.NodeID(t, to)
			do := func(c *redis.Client, args ...any) {
				t.Helper()
				if err := c.Do(ctx, args...).Err(); err != nil {
					t.Fatalf("%v: %v", args, err)
				}
			}
			do(admin[to], "CLUSTER", "SETSLOT", slot, "IMPORTING", fromID)
			do(admin[from], "CLUSTER", "SETSLOT", slot, "MIGRATING", toID)
			migrate := func() {
				names, err := admin[from].ClusterGetKeysInSlot(ctx, slot, 100).Result()
				if err != nil || len(names) == 0 {
					t.Fatalf("keys in slot %d: %v, %v", slot, names, err)
				}
				host, port, _ := strings.Cut(to, ":")
				args := []any{"MIGRATE", host, port, "", 0, 5000, "KEYS"}
				for _, n := range names {
					args = append(args, n)
				}
				do(admin[from], args...)
			}
			finish := func() {
				for _, c := range []*redis.Client{admin[to], admin[from]} {
					do(c, "CLUSTER", "SETSLOT", slot, "NODE", toID)
				}
				for addr, c := range admin {
					if addr != to && addr != from {
						do(c, "CLUSTER", "SETSLOT", slot, "NODE", toID)
					}
				}
			}
			switch step {
			case "migrating, key moved":
				migrate()
			case "moved":
				migrate()
				finish()
			}
			before, refusals := st.CrossRefused(), tryAgains()
			if step == "moved" {
				round(1)
			} else {
				// The slot's request is refused with TRYAGAIN until the
				// slot has moved: its caller waits, and is answered once
				// the move ends. The move ends after more refusals than
				// go-redis's own retries make (4 tries).
				done := make(chan struct{})
				go func() {
					defer close(done)
					round(1)
				}()
				tick := time.NewTicker(time.Millisecond)
				for i := 0; tryAgains() < refusals+6; i++ {
					if i == 10000 {
						t.Fatal("no call refused with TRYAGAIN")
					}
					<-tick.C
				}
				tick.Stop()
				if step == "migrating, key not moved" {
					migrate()
				}
				finish()
				<-done
			}
			if got := st.CrossRefused() - before; got != 1 {
				t.Errorf("%d slots refused, want 1 (slot %d)", got, slot)
			}
			round(0)
		})
	}
}

// decideUnderLoad has 64 goroutines decide requests of one on keys of a
// bucket (quota 100 an hour, on a clock that stands still) through lim
// until stop is closed, then checks the replay: each key admitted exactly
// min(its requests, 100), and its bucket holds exactly what that leaves,
// so no request was lost or charged twice. It returns the admissions and
// the caller errors.
func decideUnderLoad(t *testing.T, lim *floodgate.Limiter, keys int, stop <-chan struct{}) (admitted, exact int64, errs int64) {
	t.Helper()
	const quota = 100
	var wg sync.WaitGroup
	reqs := make([]atomic.Int64, keys)
	adm := make([]atomic.Int64, keys)
	var errCount atomic.Int64
	var firstErr atomic.Pointer[error]
	for g := range 64 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(g), 9))
			for {
				select {
				case <-stop:
					return
				default:
				}
				k := rng.IntN(keys)
				ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
				res, err := lim.Allow(ctx, "k"+strconv.Itoa(k))
				cancel()
				reqs[k].Add(1)
				if err != nil {
					errCount.Add(1)
					firstErr.CompareAndSwap(nil, &err)
					continue
				}
				if res.Allowed {
					adm[k].Add(1)
				}
			}
		}()
	}
	wg.Wait()
	if p := firstErr.Load(); p != nil {
		t.Errorf("%d caller errors, the first: %v", errCount.Load(), *p)
	}
	remaining := make([]int64, keys)
	var peeks sync.WaitGroup
	for g := range 16 {
		peeks.Add(1)
		go func() {
			defer peeks.Done()
			for k := g; k < keys; k += 16 {
				res, err := lim.Peek(context.Background(), "k"+strconv.Itoa(k))
				if err != nil {
					t.Errorf("peek k%d: %v", k, err)
				}
				remaining[k] = res.Remaining
			}
		}()
	}
	peeks.Wait()
	for k := range keys {
		r, a := reqs[k].Load(), adm[k].Load()
		admitted += a
		exact += min(r, quota)
		if a != min(r, quota) || remaining[k] != quota-a {
			t.Errorf("key k%d: %d requests, %d admitted, %d remaining; want %d admitted, %d remaining", k, r, a, remaining[k], min(r, quota), quota-min(r, quota))
		}
	}
	return admitted, exact, errCount.Load()
}

// loadResult is what decideUnderLoad found.
type loadResult struct{ admitted, exact, errs int64 }

func (r loadResult) String() string {
	return fmt.Sprintf("%d admitted of %d exact (%.1f%%), %d caller errors",
		r.admitted, r.exact, 100*float64(r.admitted)/float64(max(r.exact, 1)), r.errs)
}

// underLoad has decideUnderLoad decide on 2000 keys through a limiter of
// st (a bucket of 100 an hour) for the time before, while act runs, and
// for the time after, and returns how long act took and what the replay
// found.
func underLoad(t *testing.T, st *redisstore.Store, before, after time.Duration, act func()) (time.Duration, loadResult) {
	t.Helper()
	lim := limiter(t, st, floodgate.TokenBucket(1, time.Hour, 100))
	stop := make(chan struct{})
	done := make(chan loadResult)
	go func() {
		a, e, n := decideUnderLoad(t, lim, 2000, stop)
		done <- loadResult{a, e, n}
	}()
	time.Sleep(before) // a real cluster under real load
	start := time.Now()
	act()
	took := time.Since(start)
	time.Sleep(after)
	close(stop)
	return took, <-done
}

// TestClusterReshardUnderLoad moves thousands of slots, keys and all, from
// one master to another with redis-cli --cluster reshard while 64
// goroutines decide: no caller sees an error, and every key's admissions
// and state are exactly those of the same requests replayed in order.
func TestClusterReshardUnderLoad(t *testing.T) {
	cluster := redistest.StartCluster(t, 3)
	clock := storetest.NewClock(storetest.Base)
	st := newStore(t, cluster.Client(t), &redisstore.Options{Prefix: "rs:", Clock: clock})
	// Under load before the first slot moves, and after the last.
	took, r := underLoad(t, st, 200*time.Millisecond, 200*time.Millisecond, func() {
		cluster.Reshard(t, cluster.Addrs[0], cluster.Addrs[1], 2000, 90*time.Second)
	})
	s := st.Stats()
	t.Logf("2000 slots moved in %s; %s; %d slots refused and sent again; %.1f decisions per script call",
		took.Round(time.Millisecond), r, st.CrossRefused(), float64(s.Decisions)/float64(max(s.ScriptCalls, 1)))
}

// TestClusterFailoverUnderLoad fails a master over to its replica (CLUSTER
// FAILOVER) while 64 goroutines decide: no caller sees an error, and the
// replay is exact, as for a reshard.
func TestClusterFailoverUnderLoad(t *testing.T) {
	cluster := redistest.StartClusterReplicas(t, 3)
	clock := storetest.NewClock(storetest.Base)
	st := newStore(t, cluster.Client(t), &redisstore.Options{Prefix: "fo:", Clock: clock})
	took, r := underLoad(t, st, 300*time.Millisecond, 500*time.Millisecond, func() {
		cluster.Failover(t, cluster.Addrs[3]) // the first master's replica, or another's: either is a master's
	})
	t.Logf("failover took %s; %s; %d slots refused and sent again", took.Round(time.Millisecond), r, st.CrossRefused())
}

// TestCrossSlotFallback: where the masters refuse the function library,
// which holds the cross-slot function (here an ACL user without FUNCTION
// LOAD on a Cluster where it was never loaded, as on a managed Cluster),
// the Store batches per slot with scripts, decides alike, and says so once
// in its log.
func TestCrossSlotFallback(t *testing.T) {
	cluster := redistest.StartCluster(t, 3)
	ctx := context.Background()
	var buf syncbuf.Buffer
	logger := slog.New(slog.NewTextHandler(&buf, nil))
	for _, s := range cluster.Servers {
		err := s.Admin(t).Do(ctx, "ACL", "SETUSER", "noload", "on", ">pw", "~*", "&*", "+@all", "-function|load").Err()
		if err != nil {
			t.Fatal(err)
		}
	}
	cc := redis.NewClusterClient(&redis.ClusterOptions{Addrs: cluster.Addrs, Username: "noload", Password: "pw"})
	t.Cleanup(func() { cc.Close() })
	st := newStore(t, cc, &redisstore.Options{Prefix: "fb:", Logger: logger})
	bucket := bucketAndWindow(t)[0]
	pol, err := st.Prepare([]core.Spec{bucket})
	if err != nil {
		t.Fatal(err)
	}
	master := st.Partition("k0")
	var keys []string
	for j := 0; len(keys) < 16; j++ {
		if k := "k" + strconv.Itoa(j); st.Partition(k) == master {
			keys = append(keys, k)
		}
	}
	for round := range 4 {
		before := st.Stats()
		ds, errs := st.TakePipeline(ctx, pol, keys, 1)
		after := st.Stats()
		for i, k := range keys {
			if errs[i] != nil || ds[i].Allowed != (round < 3) {
				t.Fatalf("round %d, key %s: %+v, %v", round, k, ds[i], errs[i])
			}
		}
		if calls := after.ScriptCalls - before.ScriptCalls; round > 0 && calls != uint64(len(keys)) {
			t.Errorf("round %d: %d script calls for %d keys of as many slots, want one per slot", round, calls, len(keys))
		}
	}
	if n := strings.Count(buf.String(), "batching per slot"); n != 1 {
		t.Errorf("the log says cross-slot %d times, want once:\n%s", n, buf.String())
	}
}

// TestClusterMasterHangs stops one of three masters (SIGSTOP: its
// connections stay open and never answer) while 48 goroutines decide on
// keys of every master, each call bounded by its own context: the calls
// for the hung master's keys end at their deadline, and those for the
// other masters' keys are all decided, their batches never waiting for
// the hung one.
func TestClusterMasterHangs(t *testing.T) {
	cluster := redistest.StartCluster(t, 3)
	user, pass := cluster.Servers[0].User()
	client := redis.NewClusterClient(&redis.ClusterOptions{Addrs: cluster.Addrs, Username: user, Password: pass, ContextTimeoutEnabled: true})
	t.Cleanup(func() { client.Close() })
	st := newStore(t, client, &redisstore.Options{Prefix: "hang:"})
	lim := limiter(t, st, floodgate.TokenBucket(1000, time.Second, 1000))
	hung := cluster.Servers[0]
	var keys []string
	onHung := map[string]bool{}
	for i := 0; len(keys) < 300; i++ {
		k := "k" + strconv.Itoa(i)
		if _, err := lim.Allow(context.Background(), k); err != nil {
			t.Fatal(err)
		}
		keys = append(keys, k)
		onHung[k] = st.Partition(k) == hung.Addr
	}
	if err := hung.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { hung.Signal(syscall.SIGCONT) })
	var healthy, healthyErrs, hungErrs, hungOK atomic.Int64
	var firstErr atomic.Pointer[error]
	// Each call's deadline is one that a loaded machine keeps for a
	// healthy master: a call that waited for the hung one would still
	// reach it.
	deadline := time.Now().Add(2 * time.Second)
	var wg sync.WaitGroup
	for g := range 48 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := g; time.Now().Before(deadline); i += 48 {
				k := keys[i%len(keys)]
				ctx, cancel := context.WithTimeout(context.Background(), time.Second)
				_, err := lim.Allow(ctx, k)
				cancel()
				switch {
				case onHung[k] && err != nil:
					hungErrs.Add(1)
				case onHung[k]:
					hungOK.Add(1)
				case err != nil:
					healthyErrs.Add(1)
					firstErr.CompareAndSwap(nil, &err)
				default:
					healthy.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	t.Logf("healthy masters: %d decided, %d errors; hung master: %d errors, %d decided", healthy.Load(), healthyErrs.Load(), hungErrs.Load(), hungOK.Load())
	if p := firstErr.Load(); p != nil {
		t.Errorf("%d calls for healthy masters failed, the first: %v", healthyErrs.Load(), *p)
	}
	if healthy.Load() == 0 || hungErrs.Load() == 0 || hungOK.Load() != 0 {
		t.Errorf("want decisions on the healthy masters, and only errors on the hung one")
	}
}

// TestCrossSlotDeclaredKeys: the cross-slot call names only the keys it
// passes (the key checker, CheckDeclaredKeys, run on every part's keys and
// probe), and a key whose override the fast path cannot decide (limits of
// other kinds, set by another process) is answered in its part with the
// override, charged nothing there, and decided once by decide.lua with
// the override's keys declared: every key is charged exactly once per
// round, the others' in one script call for the master.
func TestCrossSlotDeclaredKeys(t *testing.T) {
	cluster := redistest.StartCluster(t, 3)
	ctx := context.Background()
	clock := storetest.NewClock(storetest.Base)
	bucket := bucketAndWindow(t)[0] // a quota of 3 an hour
	sliding, err := core.NewWindow(core.Sliding, "sliding", 50, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	log, err := core.NewWindow(core.Log, "log", 20, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	prepared := func() (*redisstore.Store, core.Policy) {
		st := newStore(t, cluster.Client(t), &redisstore.Options{Prefix: "xd:", Clock: clock})
		st.CheckDeclaredKeys()
		pol, err := st.Prepare([]core.Spec{bucket})
		if err != nil {
			t.Fatal(err)
		}
		return st, pol
	}
	_, setter := prepared()
	st, pol := prepared()
	master := st.Partition("k0")
	var keys []string
	for j := 0; len(keys) < 16; j++ {
		if k := "k" + strconv.Itoa(j); st.Partition(k) == master {
			keys = append(keys, k)
		}
	}
	overridden := map[string]bool{keys[3]: true, keys[9]: true}
	for k := range overridden {
		if err := setter.SetOverride(ctx, k, &core.Override{Limits: []core.Spec{sliding, log}}, core.Additive); err != nil {
			t.Fatal(err)
		}
	}
	for round := range 4 {
		before := st.Stats().ScriptCalls
		ds, errs := st.TakePipeline(ctx, pol, keys, 1)
		calls := st.Stats().ScriptCalls - before
		for i, k := range keys {
			d, err := ds[i], errs[i]
			switch {
			case err != nil:
				t.Fatalf("round %d, key %s: %v", round, k, err)
			case overridden[k] && (!d.Allowed || len(d.Limits) != 2 || d.Remaining != int64(19-round)):
				t.Errorf("round %d, overridden key %s: %+v; want allowed by the override, %d remaining", round, k, d, 19-round)
			case !overridden[k] && (d.Allowed != (round < 3) || d.Limits != nil || d.Remaining != int64(max(2-round, 0))):
				t.Errorf("round %d, key %s: %+v; want allowed %v, %d remaining", round, k, d, round < 3, max(2-round, 0))
			}
		}
		// One cross-slot call, and one decide.lua call per overridden
		// key's slot.
		if want := uint64(1 + len(overridden)); calls != want {
			t.Errorf("round %d: %d script calls, want %d", round, calls, want)
		}
	}
	if n := st.CrossRefused(); n != 0 {
		t.Errorf("%d slots refused on a stable Cluster", n)
	}
}

// A cross-slot call whose slots' parts repeat keys (hot keys, whose parts
// declare each distinct key once and map their requests to them) decides
// each request in order on its key, with only the keys it passes named
// (the key checker), in one script call.
func TestCrossSlotHotKeys(t *testing.T) {
	cluster := redistest.StartCluster(t, 3)
	ctx := context.Background()
	st := newStore(t, cluster.Client(t), &redisstore.Options{Prefix: "xh:", Clock: storetest.NewClock(storetest.Base)})
	st.CheckDeclaredKeys()
	pol, err := st.Prepare([]core.Spec{bucketAndWindow(t)[0]}) // a quota of 3 an hour
	if err != nil {
		t.Fatal(err)
	}
	master := st.Partition("h0")
	var keys, batch []string
	for j := 0; len(keys) < 8; j++ {
		if k := "h" + strconv.Itoa(j); st.Partition(k) == master {
			keys = append(keys, k)
			batch = append(batch, k, k, k, k)
		}
	}
	before := st.Stats().ScriptCalls
	ds, errs := st.TakePipeline(ctx, pol, batch, 1)
	if calls := st.Stats().ScriptCalls - before; calls != 1 {
		t.Errorf("%d script calls, want 1", calls)
	}
	for i, k := range batch {
		want := int64(2 - i%4) // remaining; -1 denied
		got := ds[i].Remaining
		if !ds[i].Allowed {
			got = -1
		}
		if errs[i] != nil || got != want {
			t.Errorf("request %d on %s: remaining %d (allowed %v), error %v; want %d", i, k, ds[i].Remaining, ds[i].Allowed, errs[i], want)
		}
	}
}

// TestCrossSlotWrongType: in a cross-slot call of lone requests, one on a
// key whose state holds a value of another type fails alone, as a call
// of its slot alone would fail it, and the others are decided, whether
// the master reads its slots EXISTS first (after slots of new keys) or
// MGET first (after slots of keys that hold states).
func TestCrossSlotWrongType(t *testing.T) {
	cluster := redistest.StartCluster(t, 3)
	ctx := context.Background()
	client, admin := cluster.Client(t), cluster.Admin(t)
	for i, spec := range bucketAndWindow(t) {
		name := [...]string{"bucket", "window"}[i] // a quota of 3 an hour each
		t.Run(name, func(t *testing.T) {
			prefix := "xw" + strconv.Itoa(i) + ":"
			st := newStore(t, client, &redisstore.Options{Prefix: prefix, Clock: storetest.NewClock(storetest.Base)})
			st.CheckDeclaredKeys()
			pol, err := st.Prepare([]core.Spec{spec})
			if err != nil {
				t.Fatal(err)
			}
			master := st.Partition("w0")
			var keys []string
			for j := 0; len(keys) < 24; j++ {
				if k := "w" + strconv.Itoa(j); st.Partition(k) == master {
					keys = append(keys, k)
				}
			}
			wrong := map[string]bool{keys[11]: true, keys[23]: true}
			suffix := map[core.Kind]string{core.Bucket: ":0b", core.Fixed: ":0f"}[spec.Kind]
			for k := range wrong {
				// Another type's data, which the ACL user may not write.
				if err := admin.HSet(ctx, prefix+"{"+k+"}"+suffix, "f", "v").Err(); err != nil {
					t.Fatal(err)
				}
			}
			// Round 0: twelve slots of new keys, then one of another type
			// (EXISTS first), twelve more. Round 1: the same keys, which
			// now hold states but the two (MGET first).
			for round := range 2 {
				before := st.Stats().ScriptCalls
				ds, errs := st.TakePipeline(ctx, pol, keys, 1)
				if calls := st.Stats().ScriptCalls - before; calls != 1 {
					t.Errorf("round %d: %d script calls, want 1", round, calls)
				}
				for j, k := range keys {
					switch {
					case wrong[k] && (!errors.Is(errs[j], floodgate.ErrStore) || !strings.Contains(errs[j].Error(), "wrong type")):
						t.Errorf("round %d, key %s of another type: error %v, want ErrStore, wrong type", round, k, errs[j])
					case !wrong[k] && (errs[j] != nil || !ds[j].Allowed || ds[j].Remaining != int64(2-round)):
						t.Errorf("round %d, key %s: %+v, error %v; want allowed, %d remaining", round, k, ds[j], errs[j], 2-round)
					}
				}
			}
			for k := range wrong {
				if typ := admin.Type(ctx, prefix+"{"+k+"}"+suffix).Val(); typ != "hash" {
					t.Errorf("key %s holds a %s, want its hash untouched", k, typ)
				}
			}
		})
	}
}

// TestCrossSlotMatchesStandalone: rounds of random batches (new keys,
// keys that hold states, repeated keys, peeks and takes of several
// units, time moving on) decided by cross-slot calls on a Cluster master
// and by a standalone server give the same decisions, for a bucket and a
// fixed window.
func TestCrossSlotMatchesStandalone(t *testing.T) {
	cluster := redistest.StartCluster(t, 3)
	alone := redistest.Start(t).Client(t)
	ctx := context.Background()
	for i, spec := range bucketAndWindow(t) { // a quota of 3 an hour each
		name := [...]string{"bucket", "window"}[i]
		t.Run(name, func(t *testing.T) {
			clock := storetest.NewClock(storetest.Base)
			prefix := "xs" + strconv.Itoa(i) + ":"
			cst := newStore(t, cluster.Client(t), &redisstore.Options{Prefix: prefix, Clock: clock})
			cst.CheckDeclaredKeys()
			sst := newStore(t, alone, &redisstore.Options{Prefix: prefix, Clock: clock})
			cpol, err := cst.Prepare([]core.Spec{spec})
			if err != nil {
				t.Fatal(err)
			}
			spol, err := sst.Prepare([]core.Spec{spec})
			if err != nil {
				t.Fatal(err)
			}
			master := cst.Partition("s0")
			var keys []string
			for j := 0; len(keys) < 40; j++ {
				if k := "s" + strconv.Itoa(j); cst.Partition(k) == master {
					keys = append(keys, k)
				}
			}
			// Overrides on a few keys, before any state: the first request
			// of each finds an override and no state, and the fast path
			// decides it under the override's bucket.
			five, err := core.NewBucket("token-bucket", 1, time.Hour, 5, "burst")
			if err != nil {
				t.Fatal(err)
			}
			for _, k := range keys[:4] {
				o := &core.Override{Limits: []core.Spec{five}}
				if err := cpol.SetOverride(ctx, k, o, core.Additive); err != nil {
					t.Fatal(err)
				}
				if err := spol.SetOverride(ctx, k, o, core.Additive); err != nil {
					t.Fatal(err)
				}
			}
			rng := rand.New(rand.NewPCG(1, uint64(i)))
			overridden := 0 // decisions under an override
			for round := range 60 {
				clock.Advance(time.Duration(rng.IntN(1800)) * time.Second)
				batch := make([]string, 2+rng.IntN(20))
				for j := range batch {
					batch[j] = keys[rng.IntN(len(keys))]
				}
				n := int64(rng.IntN(4)) // 0 peeks
				cds, cerrs := cst.TakePipeline(ctx, cpol, batch, n)
				sds, serrs := sst.TakePipeline(ctx, spol, batch, n)
				for j, k := range batch {
					if cerrs[j] != nil || serrs[j] != nil {
						t.Fatalf("round %d, key %s: errors %v (Cluster), %v (standalone)", round, k, cerrs[j], serrs[j])
					}
					if cds[j].Limits != nil {
						overridden++
					}
					if cds[j].Verdict != sds[j].Verdict || cds[j].Index != sds[j].Index || !reflect.DeepEqual(cds[j].Limits, sds[j].Limits) {
						t.Errorf("round %d, request %d on %s, cost %d: %+v on the Cluster, %+v standalone", round, j, k, n, cds[j], sds[j])
					}
				}
			}
			if n := cst.CrossRefused(); n != 0 {
				t.Errorf("%d slots refused on a stable Cluster", n)
			}
			if overridden == 0 {
				t.Error("no decision was made under an override")
			}
		})
	}
}

// TestPipelineTryAgainRunsOnce sends a master a pipeline of two per-slot
// script calls, the first refused with TRYAGAIN (its slot migrating, its
// state there and its override key not), and checks that the call beside
// it ran once: go-redis's Cluster pipeline sends a node's calls again, all
// of them, when the first one's error is one it retries, so that the
// calls that had run were charged again.
func TestPipelineTryAgainRunsOnce(t *testing.T) {
	cluster := redistest.StartCluster(t, 3)
	ctx := context.Background()
	clock := storetest.NewClock(storetest.Base)
	st := newStore(t, cluster.Client(t), &redisstore.Options{Prefix: "ta:", Clock: clock})
	st.DisableCrossSlot()
	pol, err := st.Prepare(bucketAndWindow(t)[:1]) // a quota of 3 an hour
	if err != nil {
		t.Fatal(err)
	}
	slot := func(k string) int64 { return int64(redisstore.SlotOf("ta:{" + k + "}:0b")) }
	moving, from := "k0", st.Partition("k0")
	beside := ""
	for j := 1; beside == ""; j++ {
		if k := "k" + strconv.Itoa(j); st.Partition(k) == from && slot(k) != slot(moving) {
			beside = k
		}
	}
	var to string
	for _, s := range cluster.Servers {
		if s.Addr != from {
			to = s.Addr
			break
		}
	}
	take := func(ctx context.Context, keys ...string) ([]core.Decision, []error) {
		t.Helper()
		return st.TakePipeline(ctx, pol, keys, 1)
	}
	if _, errs := take(ctx, moving); errs[0] != nil {
		t.Fatal(errs[0])
	}
	admin := cluster.Servers[0].Admin(t)
	for _, s := range cluster.Servers {
		if s.Addr == from {
			admin = s.Admin(t)
		}
	}
	if err := admin.Do(ctx, "CLUSTER", "SETSLOT", slot(moving), "MIGRATING", cluster.NodeID(t, to)).Err(); err != nil {
		t.Fatal(err)
	}
	short, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	ds, errs := take(short, moving, beside)
	cancel()
	if err := admin.Do(ctx, "CLUSTER", "SETSLOT", slot(moving), "STABLE").Err(); err != nil {
		t.Fatal(err)
	}
	if errs[0] == nil {
		t.Errorf("the migrating slot's call: %+v, want an error (TRYAGAIN until its caller gave up)", ds[0])
	}
	if errs[1] != nil || !ds[1].Allowed || ds[1].Remaining != 2 {
		t.Errorf("the call beside it: %+v, %v; want allowed, 2 remaining", ds[1], errs[1])
	}
	// Charged once each: moving's refused call not at all.
	ds, errs = take(ctx, moving, beside)
	for i, want := range []int64{1, 1} {
		if errs[i] != nil || !ds[i].Allowed || ds[i].Remaining != want {
			t.Errorf("then call %d: %+v, %v; want allowed, %d remaining", i, ds[i], errs[i], want)
		}
	}
}
