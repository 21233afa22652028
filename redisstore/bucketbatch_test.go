package redisstore_test

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"slices"
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

// A batch of lone bucket decisions goes to Redis as one call of the fast
// path's batch, and decides each request as a call of its own would: the
// same key several times in order, a key with a lone bucket's override
// by that override, a key with another override by decide.lua, and a key
// holding foreign data with an error of its own.
func TestBucketBatch(t *testing.T) {
	for _, tt := range []struct {
		name               string
		batch, slow, noFns bool // one batch; decide.lua for all; scripts, not functions
	}{
		{"batch", true, false, false},
		{"batch of scripts", true, false, true},
		{"one by one", false, false, false},
		{"decide.lua one by one", false, true, false},
	} {
		batch := tt.batch
		t.Run(tt.name, func(t *testing.T) {
			ctx := context.Background()
			srv := redistest.Start(t)
			client, admin := srv.Client(t), srv.Admin(t)
			st := newStore(t, client, &redisstore.Options{Prefix: "bb:", Clock: storetest.NewClock(storetest.Base), DisableFunctions: tt.noFns})
			if tt.slow {
				st.DisableFastPath()
			}
			lim := limiter(t, st, floodgate.TokenBucket(1, time.Hour, 3))
			pol := hourBucket(t, st, 3)
			if err := admin.LPush(ctx, "bb:{list}:0b", "x").Err(); err != nil {
				t.Fatal(err)
			}
			if err := lim.SetOverride(ctx, "lone", floodgate.Override{Limits: []floodgate.Limit{floodgate.TokenBucket(1, time.Hour, 5)}}, floodgate.AsIs); err != nil {
				t.Fatal(err)
			}
			two := []floodgate.Limit{floodgate.TokenBucket(1, time.Hour, 2), floodgate.FixedWindow(9, time.Hour)}
			if err := lim.SetOverride(ctx, "two", floodgate.Override{Limits: two}, floodgate.AsIs); err != nil {
				t.Fatal(err)
			}
			keys := []string{"a", "a", "a", "a", "list", "lone", "two", "b", "two"}
			want := []struct {
				allowed   bool
				remaining int64
				limits    int    // len(Decision.Limits): the override's
				err       string // in the error, for the key of foreign data
			}{
				{true, 2, 0, ""}, {true, 1, 0, ""}, {true, 0, 0, ""}, {false, 0, 0, ""},
				{err: "wrong type"},
				{true, 2, 1, ""}, // as-is: the 3 of the key's own limit, less 1
				{true, 1, 2, ""},
				{true, 2, 0, ""},
				{true, 0, 2, ""},
			}
			var ds []core.Decision
			var errs []error
			before := st.Stats()
			if batch {
				ds, errs = st.TakeBatch(ctx, pol, keys, 1)
			} else {
				for _, k := range keys {
					d, err := st.TakeBatch(ctx, pol, []string{k}, 1)
					ds, errs = append(ds, d[0]), append(errs, err[0])
				}
			}
			for i, w := range want {
				d, err := ds[i], errs[i]
				if w.err != "" {
					if !errors.Is(err, floodgate.ErrStore) || !strings.Contains(err.Error(), w.err) {
						t.Errorf("%d (%s): err = %v, want ErrStore with %q", i, keys[i], err, w.err)
					}
					continue
				}
				if err != nil {
					t.Errorf("%d (%s): %v", i, keys[i], err)
					continue
				}
				if d.Allowed != w.allowed || d.Remaining != w.remaining || len(d.Limits) != w.limits {
					t.Errorf("%d (%s): allowed %v, remaining %d, %d limits of an override; want %v, %d, %d",
						i, keys[i], d.Allowed, d.Remaining, len(d.Limits), w.allowed, w.remaining, w.limits)
				}
			}
			if batch {
				// One call of the batch, and one of decide.lua for the two
				// requests on the key whose override it decides.
				if s := st.Stats(); s.ScriptCalls-before.ScriptCalls != 2 {
					t.Errorf("%d script calls, want 2", s.ScriptCalls-before.ScriptCalls)
				}
			}
		})
	}
}

// In a batch, a request on a key that no other request of the batch
// names is decided and written on its own, and one on a key that others
// name too (alone or in a group, here before them) on the batch's state
// of that key: each decision sees the ones before it, whichever way it
// went, over few keys (the client finds the repeats by comparing them)
// and many (by a map), for buckets and fixed windows, on the client's
// clock and on Redis's.
func TestBatchSharedKeys(t *testing.T) {
	client := redistest.Start(t).Client(t)
	many := make([]string, 20)
	for i := range many {
		many[i] = fmt.Sprintf("m%d", i)
	}
	for _, tt := range []struct {
		name        string
		keys, group []string
		want, gwant []int64 // remaining; -1 denied
		then        []int64 // remaining of one more request on each of keys, one by one
		// again and gagain are the remaining of the batch once more, after
		// then: on states that the batch reads with MGET, rather than on
		// new keys.
		again, gagain []int64
	}{
		{"distinct", []string{"a", "b", "c"}, nil, []int64{2, 2, 2}, nil, []int64{1, 1, 1}, []int64{0, 0, 0}, nil},
		{"repeated", []string{"a", "b", "a", "a", "a"}, nil, []int64{2, 2, 1, 0, -1}, nil, []int64{-1, 1, -1, -1, -1}, []int64{-1, 0, -1, -1, -1}, nil},
		{"in the group", []string{"a", "b"}, []string{"b", "c"}, []int64{2, 1}, []int64{2, 2}, []int64{1, 0}, []int64{0, -1}, []int64{-1, 1}},
		{"many", append(slices.Clone(many), "m3"), nil,
			append(slices.Repeat([]int64{2}, 20), 1), nil, append(append(slices.Repeat([]int64{1}, 3), 0), append(slices.Repeat([]int64{1}, 16), -1)...),
			append(append(slices.Repeat([]int64{0}, 3), -1), append(slices.Repeat([]int64{0}, 16), -1)...), nil},
	} {
		for _, sp := range bucketAndWindow(t) {
			for _, server := range []bool{false, true} {
				t.Run(fmt.Sprintf("%s/kind %d/server clock %v", tt.name, sp.Kind, server), func(t *testing.T) {
					ctx := context.Background()
					opts := &redisstore.Options{Prefix: fmt.Sprintf("sk%d:", prefixes.Add(1))}
					if !server {
						opts.Clock = storetest.NewClock(storetest.Base)
					}
					st := newStore(t, client, opts)
					pol, err := st.Prepare([]core.Spec{sp})
					if err != nil {
						t.Fatal(err)
					}
					remaining := func(d core.Decision) int64 {
						if !d.Allowed {
							return -1
						}
						return d.Remaining
					}
					// batch sends the keys and the group as one batch and
					// checks what each request has left.
					batch := func(what string, want, gwant []int64) {
						t.Helper()
						ds, errs, gds, gerr := st.TakeBatchGroup(ctx, pol, tt.keys, tt.group, 1)
						if gerr != nil {
							t.Fatal(gerr)
						}
						for i, d := range ds {
							if errs[i] != nil {
								t.Fatal(errs[i])
							}
							if got := remaining(d); got != want[i] {
								t.Errorf("%srequest %d (%s): remaining %d, want %d", what, i, tt.keys[i], got, want[i])
							}
						}
						for i, d := range gds {
							if got := remaining(d); got != gwant[i] {
								t.Errorf("%sgroup's request %d (%s): remaining %d, want %d", what, i, tt.group[i], got, gwant[i])
							}
						}
					}
					batch("", tt.want, tt.gwant)
					// What the batch wrote: the next request on each key sees it.
					for i, k := range tt.keys {
						d, err := st.TakeBatch(ctx, pol, []string{k}, 1)
						if err[0] != nil {
							t.Fatal(err[0])
						}
						if got := remaining(d[0]); got != tt.then[i] {
							t.Errorf("then %s: remaining %d, want %d", k, got, tt.then[i])
						}
					}
					batch("again, ", tt.again, tt.gagain)
				})
			}
		}
	}
}

// A group that is not all or nothing, of requests that the fast path
// decides (here fixed windows, one forced, as an Envoy request's
// descriptors), is one call of the fast path's batch, and so is one that
// is all or nothing, whose denial gives the others' charges back within
// the call. A group with a key whose override only decide.lua decides
// goes there whole, and a group with a key of foreign data fails whole,
// charging nothing. Every call names only keys it declares, override keys
// included, and a group that decide.lua answers "?" for (an override whose
// keys the Store did not know) is sent again with them, charged once.
func TestGroupFastPath(t *testing.T) {
	srv := redistest.Start(t)
	client, admin := srv.Client(t), srv.Admin(t)
	t.Run("functions", func(t *testing.T) { testGroupFastPath(t, client, admin, "gf:", false) })
	t.Run("scripts", func(t *testing.T) { testGroupFastPath(t, client, admin, "gs:", true) })
}

// testGroupFastPath decides on client; admin writes the foreign data.
func testGroupFastPath(t *testing.T, client, admin *redis.Client, prefix string, noFns bool) {
	ctx := context.Background()
	clock := storetest.NewClock(storetest.Base)
	st := newStore(t, client, &redisstore.Options{Prefix: prefix, Clock: clock, DisableFunctions: noFns})
	st.CheckDeclaredKeys() // every key the calls name is declared, override keys included
	lim := limiter(t, st, floodgate.FixedWindow(3, time.Hour))
	if err := lim.SetOverride(ctx, "two", floodgate.Override{Limits: []floodgate.Limit{floodgate.FixedWindow(9, time.Hour), floodgate.PerSecond(5)}}, floodgate.AsIs); err != nil {
		t.Fatal(err)
	}
	// same's override is of the Policy's kind: the fast path decides it.
	if err := lim.SetOverride(ctx, "same", floodgate.Override{Limits: []floodgate.Limit{floodgate.FixedWindow(5, time.Hour)}}, floodgate.AsIs); err != nil {
		t.Fatal(err)
	}
	if err := admin.LPush(ctx, prefix+"{list}:0f", "x").Err(); err != nil {
		t.Fatal(err)
	}
	type want struct {
		remaining  int64
		overridden bool // decided by the key's override
		undone     bool // charged, then given back as the group was denied
	}
	for _, tt := range []struct {
		name  string
		keys  []string
		all   bool
		calls uint64 // script calls
		want  []want // nil: the group fails with "wrong type"
	}{
		{"fast", []string{"a", "b", "a"}, false, 1, []want{{2, false, false}, {2, false, false}, {1, false, false}}},
		{"again", []string{"a", "b", "a"}, false, 1, []want{{0, false, false}, {1, false, false}, {0, false, false}}},
		// The fast path hands the group on, and the key is remembered.
		{"an override for decide.lua", []string{"c", "two"}, false, 2, []want{{2, false, false}, {2, true, false}}}, // as-is: 3 of the window carried over
		{"remembered", []string{"c", "two"}, false, 1, []want{{1, false, false}, {1, true, false}}},
		{"foreign data", []string{"d", "list"}, false, 1, nil},
		{"all or nothing", []string{"e", "b"}, true, 1, []want{{2, false, false}, {0, false, false}}},
		// b is empty: f's forced charge is given back, in the same call.
		{"all or nothing, denied", []string{"f", "b"}, true, 1, []want{{3, false, true}, {0, false, false}}},
		{"all or nothing, then as before", []string{"f", "e"}, false, 1, []want{{2, false, false}, {1, false, false}}},
		// c's override is decide.lua's: the group goes there whole.
		{"all or nothing, an override for decide.lua", []string{"c", "two", "b"}, true, 1, []want{{1, false, true}, {1, true, true}, {0, false, false}}},
		// same's override, read from its override key, decides it here
		// (as-is: the window's 3 remaining carried over).
		{"all or nothing, an override of the fast path", []string{"h", "same"}, true, 1, []want{{2, false, false}, {2, true, false}}},
		{"all or nothing, an override of the fast path, denied", []string{"same", "b"}, true, 1, []want{{2, true, true}, {0, false, false}}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			reqs := make([]floodgate.Request, len(tt.keys))
			for i, k := range tt.keys {
				reqs[i] = floodgate.Request{Limiter: lim, Key: k, N: 1, Force: i == 0}
			}
			before := st.Stats()
			err := floodgate.AllowGroup(ctx, reqs, tt.all)
			if s := st.Stats(); s.ScriptCalls-before.ScriptCalls != tt.calls {
				t.Errorf("%d script calls, want %d", s.ScriptCalls-before.ScriptCalls, tt.calls)
			}
			if tt.want == nil {
				if !errors.Is(err, floodgate.ErrStore) || !strings.Contains(err.Error(), "wrong type") {
					t.Fatalf("err = %v, want ErrStore with %q", err, "wrong type")
				}
				// Nothing charged: d is still full.
				if r, err := lim.AllowN(ctx, "d", 0); err != nil || r.Remaining != 3 {
					t.Errorf("d after the failed group: %+v, %v; want 3 remaining", r, err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			for i, w := range tt.want {
				r := reqs[i].Result
				undone := !r.Allowed && r.RetryAfter == 0
				if r.Remaining != w.remaining || r.Overridden != w.overridden || undone != w.undone {
					t.Errorf("%d (%s): %+v; want %d remaining, overridden %v, undone %v", i, tt.keys[i], r, w.remaining, w.overridden, w.undone)
				}
			}
		})
	}
	// Another Store changes two's override to one with a sliding log,
	// whose key st does not know to declare. two is remembered as
	// decide.lua's, so the group goes there: two answers "?", which fails
	// the group there, giving g's charge back in that call, and st sends
	// it again with the log's key. g is charged once.
	other := newStore(t, client, &redisstore.Options{Prefix: prefix, Clock: clock, DisableFunctions: noFns})
	other.CheckDeclaredKeys()
	if err := limiter(t, other, floodgate.FixedWindow(3, time.Hour)).SetOverride(ctx, "two", floodgate.Override{Limits: []floodgate.Limit{
		floodgate.FixedWindow(9, time.Hour), floodgate.PerSecond(5), floodgate.SlidingLog(4, time.Hour),
	}}, floodgate.AsIs); err != nil {
		t.Fatal(err)
	}
	reqs := []floodgate.Request{{Limiter: lim, Key: "g", N: 1, Force: true}, {Limiter: lim, Key: "two", N: 1}}
	before := st.Stats()
	if err := floodgate.AllowGroup(ctx, reqs, true); err != nil {
		t.Fatal(err)
	}
	if calls := st.Stats().ScriptCalls - before.ScriptCalls; calls != 2 {
		t.Errorf("undeclared override: %d script calls, want 2 (\"?\", then the group with the log's key)", calls)
	}
	if r := reqs[0].Result; !r.Allowed || r.Remaining != 2 {
		t.Errorf("undeclared override: g %+v, want allowed with 2 remaining", r)
	}
	// Its window, carried as is, took its ninth.
	if r := reqs[1].Result; !r.Allowed || !r.Overridden || r.Remaining != 0 || r.Quota != 9 {
		t.Errorf("undeclared override: two %+v, want allowed by its override's window with 0 remaining", r)
	}
	if r, err := lim.AllowN(ctx, "g", 0); err != nil || r.Remaining != 2 {
		t.Errorf("g after the group: %+v, %v; want 2 remaining", r, err)
	}

	// The fast path wrote a's window and e's, which say they have no
	// override (5); decide.lua wrote c's, which may have one (6). See
	// parseFixed.
	for key, tag := range map[string]byte{prefix + "{a}:0f": 5, prefix + "{e}:0f": 5, prefix + "{c}:0f": 6} {
		if raw := client.Get(ctx, key).Val(); raw == "" || raw[0] != tag {
			t.Errorf("%s: %q, want the form %d", key, raw, tag)
		}
	}
}

// The fast path reuses its state tables from one call to the next (see
// newBucket in bucket.lua): a key decided by its override, or one whose
// state exists, leaves nothing for the next call's key at the same place
// in the pool, alone or in a group, for buckets and windows alike.
func TestStateReuse(t *testing.T) {
	ctx := context.Background()
	client := redistest.Start(t).Client(t)
	for _, tt := range []struct {
		name          string
		limit, custom floodgate.Limit // the keys' limit, and "big"'s override
	}{
		{"bucket", floodgate.TokenBucket(1, time.Hour, 3), floodgate.TokenBucket(1, time.Hour, 9)},
		{"window", floodgate.FixedWindow(3, time.Hour), floodgate.FixedWindow(9, time.Hour)},
	} {
		t.Run(tt.name, func(t *testing.T) {
			st := newStore(t, client, &redisstore.Options{Prefix: "sr" + tt.name + ":", Clock: storetest.NewClock(storetest.Base)})
			lim := limiter(t, st, tt.limit)
			if err := lim.SetOverride(ctx, "big", floodgate.Override{Limits: []floodgate.Limit{tt.custom}}, floodgate.ResetUsage); err != nil {
				t.Fatal(err)
			}
			// Each step's keys go in one call, alone or as a group; want
			// is each key's remaining after it.
			for i, step := range []struct {
				keys []string
				want []int64
			}{
				{[]string{"big"}, []int64{8}},
				{[]string{"a"}, []int64{2}},
				{[]string{"big"}, []int64{7}},
				{[]string{"b"}, []int64{2}},
				{[]string{"big", "c"}, []int64{6, 2}},
				{[]string{"d", "big"}, []int64{2, 5}},
				{[]string{"a", "e", "big"}, []int64{1, 2, 4}},
				{[]string{"f", "g", "h"}, []int64{2, 2, 2}},
			} {
				reqs := make([]floodgate.Request, len(step.keys))
				for j, k := range step.keys {
					reqs[j] = floodgate.Request{Limiter: lim, Key: k, N: 1}
				}
				if len(reqs) == 1 {
					r, err := lim.Allow(ctx, step.keys[0])
					if err != nil {
						t.Fatalf("step %d: %v", i, err)
					}
					reqs[0].Result = r
				} else if err := floodgate.AllowGroup(ctx, reqs, false); err != nil {
					t.Fatalf("step %d: %v", i, err)
				}
				for j, r := range reqs {
					if !r.Result.Allowed || r.Result.Remaining != step.want[j] {
						t.Errorf("step %d, %s: %+v, want allowed with %d remaining", i, step.keys[j], r.Result, step.want[j])
					}
				}
			}
		})
	}
}

// hourBucket returns the Policy that st prepared for a token bucket of
// burst, refilling one token an hour: the Policy of a Limiter of
// floodgate.TokenBucket(1, time.Hour, burst) on st.
func hourBucket(t *testing.T, st *redisstore.Store, burst int64) core.Policy {
	t.Helper()
	sp, err := core.NewBucket("token-bucket", 1, time.Hour, burst, "burst")
	if err != nil {
		t.Fatal(err)
	}
	pol, err := st.Prepare([]core.Spec{sp})
	if err != nil {
		t.Fatal(err)
	}
	return pol
}

// bucketAndWindow returns the Specs of a token bucket of burst 3 and of a
// fixed window of 3, both of an hour.
func bucketAndWindow(t *testing.T) []core.Spec {
	t.Helper()
	bucket, err := core.NewBucket("token-bucket", 1, time.Hour, 3, "burst")
	if err != nil {
		t.Fatal(err)
	}
	window, err := core.NewWindow(core.Fixed, "fixed-window", 3, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	return []core.Spec{bucket, window}
}

// A batch of new keys, alone and in a group, is read with one EXISTS for
// the lone keys and one for the group's, not with a GET of each key and
// of its override key; a key holding foreign data or one with an override
// among them sends them all the way of a key that holds something, and
// each is still decided as it would be alone.
func TestBatchNewKeys(t *testing.T) {
	ctx := context.Background()
	srv := redistest.Start(t)
	client, admin := srv.Client(t), srv.Admin(t)
	for _, tt := range []struct {
		name        string
		keys, group []string
		list        string // a key holding a list, or ""
		override    string // a key with an override of 5, or ""
		gets        bool   // the batch reads keys with GET
	}{
		{"new keys", []string{"a", "b", "c"}, []string{"d", "e"}, "", "", false},
		{"a list among them", []string{"a", "list", "c"}, []string{"d", "e"}, "list", "", true},
		{"an override among them", []string{"a", "b", "c"}, []string{"d", "o"}, "", "o", true},
	} {
		for _, sp := range bucketAndWindow(t) {
			t.Run(fmt.Sprintf("%s/kind %d", tt.name, sp.Kind), func(t *testing.T) {
				prefix := fmt.Sprintf("nk%d:", prefixes.Add(1))
				st := newStore(t, client, &redisstore.Options{Prefix: prefix})
				pol, err := st.Prepare([]core.Spec{sp})
				if err != nil {
					t.Fatal(err)
				}
				suffix := map[core.Kind]string{core.Bucket: "0b", core.Fixed: "0f"}[sp.Kind]
				if tt.list != "" {
					if err := admin.LPush(ctx, prefix+"{"+tt.list+"}:"+suffix, "x").Err(); err != nil {
						t.Fatal(err)
					}
				}
				if tt.override != "" {
					lim := limiter(t, st, floodgate.TokenBucket(1, time.Hour, 3))
					o := floodgate.Override{Limits: []floodgate.Limit{floodgate.TokenBucket(1, time.Hour, 5)}}
					if sp.Kind == core.Fixed {
						o.Limits = []floodgate.Limit{floodgate.FixedWindow(5, time.Hour)}
					}
					if err := lim.SetOverride(ctx, tt.override, o, floodgate.AsIs); err != nil {
						t.Fatal(err)
					}
				}
				if err := admin.ConfigResetStat(ctx).Err(); err != nil {
					t.Fatal(err)
				}
				ds, errs, gds, gerr := st.TakeBatchGroup(ctx, pol, tt.keys, tt.group, 1)
				if gerr != nil {
					t.Fatalf("group: %v", gerr)
				}
				check := func(k string, d core.Decision, err error) {
					t.Helper()
					switch {
					case k == tt.list:
						if !errors.Is(err, floodgate.ErrStore) || !strings.Contains(err.Error(), "wrong type") {
							t.Errorf("%s: err = %v, want ErrStore with %q", k, err, "wrong type")
						}
					case err != nil:
						t.Errorf("%s: %v", k, err)
					case k == tt.override:
						// As is: the 3 of the key's own limit, less 1.
						if !d.Allowed || d.Remaining != 2 || len(d.Limits) != 1 {
							t.Errorf("%s: %+v, want allowed with 2 remaining by its override", k, d)
						}
					case !d.Allowed || d.Remaining != 2 || len(d.Limits) != 0:
						t.Errorf("%s: %+v, want allowed with 2 remaining", k, d)
					}
				}
				for i, k := range tt.keys {
					check(k, ds[i], errs[i])
				}
				for i, k := range tt.group {
					check(k, gds[i], nil)
				}
				if gets, _ := commandStats(t, client, "get"); (gets > 0) != tt.gets {
					t.Errorf("%.0f GETs, want some: %v", gets, tt.gets)
				}
				if n, _ := commandStats(t, client, "exists"); n != 2 {
					t.Errorf("%.0f EXISTS, want 2 (the lone keys', the group's)", n)
				}
				if t.Failed() {
					return
				}
				// And again, on the states the batch wrote.
				ds, errs, gds, gerr = st.TakeBatchGroup(ctx, pol, tt.keys, tt.group, 1)
				if gerr != nil {
					t.Fatalf("group again: %v", gerr)
				}
				again := func(k string, d core.Decision, err error) {
					t.Helper()
					if k != tt.list && (err != nil || d.Remaining != 1) {
						t.Errorf("again, %s: %+v, %v; want 1 remaining", k, d, err)
					}
				}
				for i, k := range tt.keys {
					again(k, ds[i], errs[i])
				}
				for i, k := range tt.group {
					again(k, gds[i], nil)
				}
			})
		}
	}
}

// A refund on a lone bucket goes through the fast path, in the same call
// as the takes of its batch, and answers as decide.lua does: on a key
// that other requests of the batch name, at most the quota, nothing
// written on a key that holds nothing, by a lone bucket's override, and
// a refund of 0 as a peek.
func TestBatchRefunds(t *testing.T) {
	srv := redistest.Start(t)
	client, admin := srv.Client(t), srv.Admin(t)
	type req struct {
		key       string
		n         int64 // below 0: a refund of -n
		remaining int64
	}
	for _, tt := range []struct {
		name string
		reqs []req
	}{
		{"take, give back, take on one key", []req{{"a", 3, 2}, {"a", -2, 4}, {"a", 4, 0}}},
		{"a lone refund after takes", []req{{"a", 5, 0}, {"b", 1, 4}}}, // then refunds in the next batch
		{"more than the quota", []req{{"a", 5, 0}, {"a", -9, 5}}},
		{"on a key that holds nothing", []req{{"none", -2, 5}, {"b", 2, 3}}},
		{"by the key's override", []req{{"lone", 4, 1}, {"lone", -20, 10}}}, // as is: 5 of its 10 left
		{"of 0", []req{{"a", 2, 3}, {"a", 0, 3}, {"a", -0, 3}}},
	} {
		for _, slow := range []bool{false, true} {
			name := tt.name
			if slow {
				name += " (decide.lua)"
			}
			t.Run(name, func(t *testing.T) {
				ctx := context.Background()
				const prefix = "br:"
				admin.FlushAll(ctx)
				st := newStore(t, client, &redisstore.Options{Prefix: prefix, Clock: storetest.NewClock(storetest.Base)})
				if slow {
					st.DisableFastPath()
				}
				lim := limiter(t, st, floodgate.TokenBucket(1, time.Hour, 5))
				if err := lim.SetOverride(ctx, "lone", floodgate.Override{Limits: []floodgate.Limit{floodgate.TokenBucket(1, time.Hour, 10)}}, floodgate.AsIs); err != nil {
					t.Fatal(err)
				}
				pol := hourBucket(t, st, 5)
				keys, ns := make([]string, len(tt.reqs)), make([]int64, len(tt.reqs))
				for i, r := range tt.reqs {
					keys[i], ns[i] = r.key, r.n
				}
				before := st.Stats()
				ds, errs, fast := st.Batch(ctx, pol, keys, ns)
				if fast == slow {
					t.Errorf("through the fast path: %v, want %v", fast, !slow)
				}
				for i, r := range tt.reqs {
					if errs[i] != nil {
						t.Fatalf("%d (%s, %d): %v", i, r.key, r.n, errs[i])
					}
					if !ds[i].Allowed || ds[i].Remaining != r.remaining {
						t.Errorf("%d (%s, %d): allowed %v, remaining %d; want true, %d", i, r.key, r.n, ds[i].Allowed, ds[i].Remaining, r.remaining)
					}
				}
				if calls := st.Stats().ScriptCalls - before.ScriptCalls; !slow && calls != 1 {
					t.Errorf("%d script calls, want 1", calls)
				}
				if n := client.Exists(ctx, prefix+"{none}:0b").Val(); n != 0 {
					t.Error("a refund on a key that held nothing wrote it")
				}
				// The next batch's lone refunds, from the state the first left.
				ds, errs, _ = st.Batch(ctx, pol, []string{"a", "c"}, []int64{-1, -1})
				for i, err := range errs {
					if err != nil {
						t.Fatal(err)
					}
					if !ds[i].Allowed {
						t.Errorf("refund %d denied", i)
					}
				}
			})
		}
	}
}

// A batch whose requests' arguments repeat in runs, which it sends once
// each with a map of the runs (argRuns), decides each request as a call
// of its own would: takes of 1 and of 2, a refund, new keys and ones
// the batch before it wrote, allowed and denied, through the function
// library and through the scripts.
func TestBatchArgRuns(t *testing.T) {
	client := redistest.Start(t).Client(t)
	ctx := context.Background()
	keys := []string{"a", "b", "c", "d", "e", "f", "g", "h"}
	ns := []int64{1, 1, 1, 2, 2, -1, 1, 1} // 4 runs of 8 arguments
	for _, noFns := range []bool{false, true} {
		t.Run(fmt.Sprintf("DisableFunctions=%v", noFns), func(t *testing.T) {
			clock := storetest.NewClock(storetest.Base)
			opts := func(prefix string) *redisstore.Options {
				return &redisstore.Options{Prefix: fmt.Sprintf("%s%v:", prefix, noFns), Clock: clock, DisableFunctions: noFns}
			}
			batched, alone := newStore(t, client, opts("arb")), newStore(t, client, opts("ara"))
			bpol, apol := hourBucket(t, batched, 3), hourBucket(t, alone, 3)
			for round := range 3 {
				ds, errs, fast := batched.Batch(ctx, bpol, keys, ns)
				if !fast {
					t.Fatalf("round %d: the batch did not go through the fast path", round)
				}
				for i, k := range keys {
					want, werrs, _ := alone.Batch(ctx, apol, []string{k}, ns[i:i+1])
					if errs[i] != nil || werrs[0] != nil {
						t.Fatalf("round %d, %s: errors %v and %v", round, k, errs[i], werrs[0])
					}
					if !reflect.DeepEqual(ds[i], want[0]) {
						t.Errorf("round %d, %s: %+v in the batch, %+v alone", round, k, ds[i], want[0])
					}
				}
				clock.Advance(20 * time.Minute)
			}
		})
	}
}
