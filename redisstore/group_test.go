package redisstore_test

import (
	"context"
	"errors"
	"testing"

	"github.com/floodgate/floodgate"
	"github.com/floodgate/floodgate/internal/redistest"
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
