package redisstore_test

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/floodgate/floodgate"
	"github.com/floodgate/floodgate/core"
	"github.com/floodgate/floodgate/internal/testkit/redistest"
	"github.com/floodgate/floodgate/redisstore"
	"github.com/floodgate/floodgate/storetest"
	"github.com/redis/go-redis/v9"
)

// checked returns a storetest.NewStore like factory's whose stores run
// the scripts with the key checker (CheckDeclaredKeys): a script call that
// names a key it did not declare fails, and so does the scenario.
func checked(client redis.UniversalClient, opts ...func(*redisstore.Options)) storetest.NewStore {
	newStore := factory(client, opts...)
	return func(t *testing.T, clock floodgate.Clock) floodgate.Store {
		st := newStore(t, clock).(*redisstore.Store)
		st.CheckDeclaredKeys()
		return st
	}
}

func scriptsOnly(o *redisstore.Options) { o.DisableFunctions = true }

// TestDeclaredKeys runs the conformance suite with the scripts checked:
// every key they name is one the call declares, as Dragonfly (by
// default), an ACL's key patterns and the scripting contract want. On a
// standalone server as functions (FCALL), as scripts (EVALSHA), and all
// through decide.lua; through Sentinel and on a Cluster as scripts, the
// path of a server without functions on every kind of store; and on a
// Cluster as functions.
func TestDeclaredKeys(t *testing.T) {
	t.Run("standalone", func(t *testing.T) {
		client := redistest.Start(t).Client(t)
		t.Run("functions", func(t *testing.T) { storetest.Run(t, checked(client)) })
		t.Run("scripts", func(t *testing.T) { storetest.Run(t, checked(client, scriptsOnly)) })
		t.Run("no-fast-path", func(t *testing.T) {
			newStore := checked(client)
			storetest.Run(t, func(t *testing.T, clock floodgate.Clock) floodgate.Store {
				st := newStore(t, clock).(*redisstore.Store)
				st.DisableFastPath()
				return st
			})
		})
	})
	t.Run("sentinel-scripts", func(t *testing.T) {
		rig := redistest.StartSentinel(t)
		client, err := redisstore.NewClient(rig.URL())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { client.Close() })
		storetest.Run(t, checked(client, scriptsOnly))
	})
	t.Run("cluster-scripts", func(t *testing.T) {
		storetest.Run(t, checked(redistest.StartCluster(t, 3).Client(t), scriptsOnly))
	})
	// With functions: the per-slot pipelines of the fast path (the suite's
	// batches rarely span slots; TestCrossSlotDeclaredKeys checks the
	// cross-slot call's keys).
	t.Run("cluster-functions", func(t *testing.T) {
		storetest.Run(t, checked(redistest.StartCluster(t, 3).Client(t)))
	})
}

// The checker itself fails a command on a key the call did not declare,
// and a command it does not know the keys of; it lets a declared key and
// a command without keys through.
func TestDeclaredChecker(t *testing.T) {
	checker, _ := redisstore.DeclaredChecker()
	client := redistest.Start(t).Client(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, tt := range []struct {
		name, lua string
		inErr     string // "" for none
	}{
		{"declared", "checkKeys(KEYS) return checkedCall('GET', KEYS[1])", ""},
		{"declared, all keys", "checkKeys(KEYS) return checkedCall('EXISTS', KEYS[1], KEYS[2])", ""},
		{"no keys", "checkKeys(KEYS) return #checkedCall('TIME')", ""},
		{"undeclared", "checkKeys(KEYS) return checkedCall('GET', KEYS[1] .. 'x')", "did not declare"},
		{"undeclared among all", "checkKeys(KEYS) return checkedCall('EXISTS', KEYS[1], 'other')", "did not declare"},
		{"undeclared, pcall", "checkKeys(KEYS) return checkedPcall('SET', 'other', '1')", "did not declare"},
		{"unknown command", "checkKeys(KEYS) return checkedCall('INCR', KEYS[1])", "not in KEY_ARGS"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			err := client.Eval(ctx, checker+tt.lua, []string{"{dk}a", "{dk}b"}).Err()
			if err == redis.Nil {
				err = nil
			}
			if tt.inErr == "" && err != nil {
				t.Fatalf("Eval: %v", err)
			}
			if tt.inErr != "" && (err == nil || !strings.Contains(err.Error(), tt.inErr)) {
				t.Fatalf("Eval: %v, want an error with %q", err, tt.inErr)
			}
		})
	}
}

// A request on a key whose override has limits of other kinds than its
// Policy's declares their keys: the first one from a process that does
// not know the override yet goes back once for them (two script calls),
// the next ones declare them at once (one), and a request after the
// override is gone declares them no more. Setting an override over one
// with keys the setter does not know goes back once too. All with the
// key checker, on the fast path's Policy and on decide.lua's.
func TestOverrideKeysDeclared(t *testing.T) {
	client := redistest.Start(t).Client(t)
	ctx := context.Background()
	clock := storetest.NewClock(storetest.Base)
	override := floodgate.Override{Limits: []floodgate.Limit{floodgate.SlidingWindow(50, time.Minute), floodgate.SlidingLog(20, time.Minute)}}
	for _, tt := range []struct {
		name   string
		limits []floodgate.Limit
		first  uint64 // script calls of a fresh process's first request
	}{
		// The fast path hands the request to decide.lua with the keys.
		{"fast-path", []floodgate.Limit{floodgate.TokenBucket(100, time.Second, 100)}, 2},
		// decide.lua sends it back once for them.
		{"decide", []floodgate.Limit{floodgate.TokenBucket(100, time.Second, 100), floodgate.FixedWindow(1000, time.Hour)}, 2},
	} {
		t.Run(tt.name, func(t *testing.T) {
			newStore := func() *redisstore.Store {
				st := newStore(t, client, &redisstore.Options{Prefix: "ok:" + tt.name + ":", Clock: clock})
				st.CheckDeclaredKeys()
				return st
			}
			setter := limiter(t, newStore(), tt.limits...)
			if err := setter.SetOverride(ctx, "k", override, floodgate.Additive); err != nil {
				t.Fatalf("SetOverride: %v", err)
			}
			st := newStore()
			lim := limiter(t, st, tt.limits...)
			calls := func(want uint64, what string) {
				t.Helper()
				before := st.Stats().ScriptCalls
				r, err := lim.Allow(ctx, "k")
				if err != nil {
					t.Fatalf("%s: %v", what, err)
				}
				if got := st.Stats().ScriptCalls - before; got != want {
					t.Errorf("%s: %d script calls, want %d", what, got, want)
				}
				if overridden := what != "after the override"; r.Overridden != overridden || (overridden && r.Quota != 20) {
					t.Errorf("%s: %+v, want overridden %v", what, r, overridden)
				}
			}
			calls(tt.first, "first request")
			calls(1, "second request")
			calls(1, "third request")
			// A fresh process replaces the override, and then deletes
			// it, with the key checker: its first call goes back once
			// for the old override's keys.
			other := limiter(t, newStore(), tt.limits...)
			if err := other.SetOverride(ctx, "k", override, floodgate.AsIs); err != nil {
				t.Fatalf("SetOverride over an unknown override: %v", err)
			}
			if err := other.DeleteOverride(ctx, "k", floodgate.Additive); err != nil {
				t.Fatalf("DeleteOverride: %v", err)
			}
			calls(1, "after the override")
		})
	}
}

// A call may pass its keys as arguments instead (PassKeysAsArgs), the one
// exception to declared keys, for a Cluster call across slots: the suite
// holds on a standalone server so, with the checker taking the keys from
// the arguments; and on a Cluster master, a decide.lua batch whose keys
// span its slots runs so (the functions' flag allow-cross-slot-keys),
// where with its keys declared Redis refuses it. (Not the fast path's
// batch: even under the flag, a command that names several keys must name
// keys of one slot, and bucketBatch reads a batch's states with one MGET
// and looks for them with one EXISTS. A call of it across slots needs
// those per slot.)
func TestKeysAsArgs(t *testing.T) {
	t.Run("standalone", func(t *testing.T) {
		newStore := checked(redistest.Start(t).Client(t))
		storetest.Run(t, func(t *testing.T, clock floodgate.Clock) floodgate.Store {
			st := newStore(t, clock).(*redisstore.Store)
			st.PassKeysAsArgs()
			return st
		})
	})
	t.Run("cluster-master", func(t *testing.T) {
		cluster := redistest.StartCluster(t, 3)
		node := cluster.Servers[0].Client(t) // the Store sees one server
		ctx := context.Background()
		shards, err := cluster.Servers[0].Admin(t).ClusterShards(ctx).Result()
		if err != nil {
			t.Fatal(err)
		}
		_, port, _ := strings.Cut(cluster.Addrs[0], "127.0.0.1:")
		own := func(slot int) bool {
			for _, sh := range shards {
				mine := false
				for _, n := range sh.Nodes {
					mine = mine || (n.Role == "master" && strconv.FormatInt(n.Port, 10) == port)
				}
				for _, r := range sh.Slots {
					if mine && slot >= int(r.Start) && slot <= int(r.End) {
						return true
					}
				}
			}
			return false
		}
		const prefix = "xs:"
		var keys []string
		seen := map[int]bool{}
		for i := 0; len(keys) < 8 && i < 10000; i++ {
			k := fmt.Sprintf("k%d", i)
			slot := redisstore.SlotOf(prefix + "{" + k + "}:0b")
			if own(slot) && !seen[slot] {
				seen[slot] = true
				keys = append(keys, k)
			}
		}
		if len(keys) < 8 {
			t.Fatalf("found %d keys of distinct slots on the first master", len(keys))
		}
		bucket, err := core.NewBucket("bucket", 10, time.Second, 10, "burst")
		if err != nil {
			t.Fatal(err)
		}
		log, err := core.NewWindow(core.Log, "log", 5, time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		for _, tt := range []struct {
			name   string
			limits []core.Spec
		}{
			{"decide", []core.Spec{bucket, log}},
			{"decide-bucket", []core.Spec{bucket}},
		} {
			t.Run(tt.name, func(t *testing.T) {
				for _, asArgs := range []bool{false, true} {
					st := newStore(t, node, &redisstore.Options{Prefix: fmt.Sprintf("%s%s:%v:", prefix, tt.name, asArgs)})
					st.DisableFastPath() // see above
					if asArgs {
						st.PassKeysAsArgs()
					}
					pol, err := st.Prepare(tt.limits)
					if err != nil {
						t.Fatal(err)
					}
					ds, errs := st.TakeBatch(ctx, pol, keys, 1)
					for i, err := range errs {
						switch {
						case asArgs && (err != nil || !ds[i].Allowed):
							t.Errorf("keys as arguments: %s: %+v, %v; want allowed", keys[i], ds[i], err)
						case !asArgs && (err == nil || !strings.Contains(err.Error(), "CROSSSLOT")):
							t.Errorf("keys declared: %s: %v, want Redis's CROSSSLOT", keys[i], err)
						}
					}
				}
			})
		}
	})
}
