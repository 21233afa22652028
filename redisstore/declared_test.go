package redisstore_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/floodgate/floodgate"
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
// path of a server without functions on every kind of store.
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
