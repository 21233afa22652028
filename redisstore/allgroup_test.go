package redisstore_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/floodgate/floodgate"
	"github.com/floodgate/floodgate/internal/testkit/redistest"
	"github.com/floodgate/floodgate/redisstore"
	"github.com/floodgate/floodgate/storetest"
)

// An all-or-nothing group of requests on lone buckets and fixed windows
// (an Envoy request's descriptors under
// STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT) is one call of the fast path,
// and decides as decide.lua and the memory store do, request by request:
// with forced charges, peeks, costs over the quota, advisory requests
// (a denial of theirs undoes nothing), several requests on one key, and
// time moving back and forth.
func TestAllOrNothingFastPath(t *testing.T) {
	client := redistest.Start(t).Client(t)
	ctx := context.Background()
	limits := []floodgate.Limit{
		floodgate.FixedWindow(3, time.Second),
		floodgate.FixedWindow(5, time.Minute),
		floodgate.TokenBucket(2, time.Second, 3),
		floodgate.GCRA(2, 7, time.Second),
	}
	for seed := range uint64(4) {
		t.Run(fmt.Sprint(seed), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(seed, 61))
			memClock, redisClock := storetest.NewClock(storetest.Base), storetest.NewClock(storetest.Base)
			mem := floodgate.NewMemoryStore(&floodgate.MemoryOptions{Clock: memClock, SweepInterval: -1})
			defer mem.Close()
			fast := newStore(t, client, &redisstore.Options{Prefix: fmt.Sprintf("ag%d:", seed), Clock: redisClock})
			slow := newStore(t, client, &redisstore.Options{Prefix: fmt.Sprintf("agd%d:", seed), Clock: redisClock})
			slow.DisableFastPath()
			fast.CheckDeclaredKeys()
			slow.CheckDeclaredKeys()
			lims := func(st floodgate.Store) []*floodgate.Limiter {
				out := make([]*floodgate.Limiter, len(limits))
				for i, l := range limits {
					out[i] = limiter(t, st, l)
				}
				return out
			}
			memLims, fastLims, slowLims := lims(mem), lims(fast), lims(slow)
			now := storetest.Base
			undone := 0
			for step := range 150 {
				now = now.Add(time.Duration(rng.IntN(400)-40) * time.Millisecond)
				memClock.Set(now)
				redisClock.Set(now)
				type member struct {
					lim           int
					key           string
					n             int64
					force, advise bool
				}
				ms := make([]member, 1+rng.IntN(4))
				for i := range ms {
					// A key is its limit's own: on Redis two Limiters of
					// one kind would share its state.
					lim := rng.IntN(len(limits))
					ms[i] = member{lim: lim, key: fmt.Sprintf("%s%d", []string{"a", "b"}[rng.IntN(2)], lim), n: int64(rng.IntN(3))}
					if rng.IntN(12) == 0 {
						ms[i].n = 9 // over every quota
					}
					ms[i].force = ms[i].lim < 2 && rng.IntN(3) == 0 // windows only, as Envoy's counting windows
					ms[i].advise = rng.IntN(5) == 0
				}
				group := func(ls []*floodgate.Limiter) []floodgate.Request {
					reqs := make([]floodgate.Request, len(ms))
					for i, m := range ms {
						reqs[i] = floodgate.Request{Limiter: ls[m.lim], Key: m.key, N: m.n, Force: m.force, Advisory: m.advise}
					}
					return reqs
				}
				want, got, gen := group(memLims), group(fastLims), group(slowLims)
				if err := floodgate.AllowGroup(ctx, want, true); err != nil {
					t.Fatal(err)
				}
				before := fast.Stats().ScriptCalls
				if err := floodgate.AllowGroup(ctx, got, true); err != nil {
					t.Fatalf("step %d: fast path: %v", step, err)
				}
				if calls := fast.Stats().ScriptCalls - before; calls != 1 {
					t.Errorf("step %d: %d script calls, want 1", step, calls)
				}
				if err := floodgate.AllowGroup(ctx, gen, true); err != nil {
					t.Fatalf("step %d: decide.lua: %v", step, err)
				}
				for i := range want {
					if got[i].Result != want[i].Result || gen[i].Result != want[i].Result {
						t.Fatalf("step %d at %s, request %d of %+v:\nfast path  %+v\ndecide.lua %+v\nmemory     %+v",
							step, now.Sub(storetest.Base), i, ms, got[i].Result, gen[i].Result, want[i].Result)
					}
					if r := want[i].Result; !r.Allowed && r.RetryAfter == 0 {
						undone++
					}
				}
			}
			if undone == 0 {
				t.Error("no group was undone: the sequence tests too little")
			}
		})
	}
}
