package redisstore_test

import (
	"context"
	"errors"
	"strconv"
	"testing"
	"time"

	"github.com/floodgate/floodgate"
	"github.com/floodgate/floodgate/internal/testkit/redistest"
	"github.com/floodgate/floodgate/redisstore"
)

// TestGroupOneScriptCall: a group of requests on four keys and two
// Limiters is one script call, and a request whose state is not
// floodgate's fails the group and leaves nothing charged.
func TestGroupOneScriptCall(t *testing.T) {
	srv := redistest.Start(t)
	client := srv.Client(t)
	ctx := context.Background()
	st := newStore(t, client, &redisstore.Options{Prefix: "grp:"})
	a := limiter(t, st, floodgate.PerSecond(10))
	b := limiter(t, st, floodgate.FixedWindow(5, 60e9), floodgate.SlidingLog(3, 60e9))
	group := func(keys ...string) []floodgate.Request {
		reqs := make([]floodgate.Request, len(keys))
		for i, k := range keys {
			reqs[i] = floodgate.Request{Limiter: a, Key: k, N: 1}
			if i%2 == 1 {
				reqs[i].Limiter = b
			}
		}
		return reqs
	}

	before := st.Stats()
	reqs := group("k1", "k2", "k3", "k4")
	if err := floodgate.AllowGroup(ctx, reqs, true); err != nil {
		t.Fatal(err)
	}
	after := st.Stats()
	if calls := after.ScriptCalls - before.ScriptCalls; calls != 1 {
		t.Errorf("a group of 4 took %d script calls, want 1", calls)
	}
	for i, r := range reqs {
		if !r.Result.Allowed {
			t.Errorf("request %d denied: %+v", i, r.Result)
		}
	}

	if err := client.Set(ctx, "grp:{bad}:0f", "not floodgate", 0).Err(); err != nil {
		t.Fatal(err)
	}
	for _, all := range []bool{false, true} {
		reqs = group("k5", "bad", "k6")
		err := floodgate.AllowGroup(ctx, reqs, all)
		if !errors.Is(err, floodgate.ErrStore) {
			t.Fatalf("all=%v: AllowGroup with a corrupt key: %v, want ErrStore", all, err)
		}
		for _, k := range []string{"k5", "k6"} {
			r, err := a.Peek(ctx, k)
			if err != nil || r.Remaining != 10 {
				t.Errorf("all=%v: %s after a failed group: %+v, %v; want 10 remaining", all, k, r, err)
			}
		}
	}
}

// TestLargeGroup: a group of thousands of requests (an Envoy request of
// as many descriptors) is decided, in every mode, and each request sees
// the ones before it. Lua passes a command's arguments on its C stack,
// which holds about 8,000: reading such a group's keys in one MGET, or
// asking EXISTS about its new keys and their override keys, failed with
// "too many results to unpack".
func TestLargeGroup(t *testing.T) {
	srv := redistest.Start(t)
	ctx := context.Background()
	st := newStore(t, srv.Client(t), &redisstore.Options{Prefix: "big:"})
	const n = 9000
	for _, tc := range []struct {
		name  string
		limit floodgate.Limit
		all   bool
	}{
		{"bucket", floodgate.TokenBucket(10, 24*time.Hour, 10), false},
		{"window", floodgate.FixedWindow(10, 24*time.Hour), false},
		{"bucket, all or nothing", floodgate.TokenBucket(10, 24*time.Hour, 10), true},
		{"window, all or nothing", floodgate.FixedWindow(10, 24*time.Hour), true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			lim := limiter(t, st, tc.limit)
			reqs := make([]floodgate.Request, n)
			for i := range reqs {
				// Keys of their own, and the last ten on one key.
				reqs[i] = floodgate.Request{Limiter: lim, Key: tc.name + strconv.Itoa(min(i, n-10)), N: 1}
			}
			for round := range 2 { // new keys, then existing ones
				if err := floodgate.AllowGroup(ctx, reqs, tc.all); err != nil {
					t.Fatalf("round %d: %v", round, err)
				}
				for i, r := range reqs {
					// Remaining after it, or -1 for denied.
					want := int64(9 - round)
					switch {
					case i >= n-10 && round == 0:
						want = int64(n - 1 - i)
					case i >= n-10:
						want = -1 // the shared key is used up
					case round == 1 && tc.all:
						want = -2 // undone with the group: not charged
					}
					got := r.Result
					ok := got.Allowed && got.Remaining == want
					if want == -1 {
						ok = !got.Allowed && got.RetryAfter > 0
					} else if want == -2 {
						ok = !got.Allowed && got.RetryAfter == 0 && got.Remaining == 9
					}
					if !ok {
						t.Fatalf("round %d, request %d: %+v, want remaining %d", round, i, got, want)
					}
				}
			}
		})
	}
}
