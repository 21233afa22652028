package redisstore

import (
	"context"
	"errors"
	"math/rand/v2"
	"strconv"
	"testing"
	"time"

	"github.com/floodgate/floodgate/core/slot"
	"github.com/floodgate/floodgate/internal/lib/storekit"
	"github.com/floodgate/floodgate/internal/testkit/redistest"
	"github.com/floodgate/floodgate/storetest"
	"github.com/redis/go-redis/v9"
)

// TestSlotBatchesMatchStep sends batches of slot operations as one script
// call each, several on one key, of two limits on the same keys, with
// duplicate acquires, double releases, releases and extends after expiry
// and a key of the wrong type among them, and holds every answer to
// slot.Spec.Step applied in the batch's order, and every key's TTL to
// its latest permit: slots.lua reads a key's size and sweeps it once per
// call, which FuzzSlots (one operation per call) does not reach.
func TestSlotBatchesMatchStep(t *testing.T) {
	srv := redistest.Start(t)
	clock := storetest.NewClock(storetest.Base)
	s := New(srv.Client(t), &Options{Prefix: "sb:", Clock: clock})
	t.Cleanup(func() { s.Close() })
	ctx := context.Background()
	admin := srv.Admin(t)
	if err := admin.Set(ctx, s.slotKey("bad"), "x", 0).Err(); err != nil {
		t.Fatal(err)
	}
	specs := []slot.Spec{{Slots: 3, Lease: 40_000}, {Slots: 5, Lease: 100_000}}
	keys := []string{"a", "b", "bad"}
	state := map[string]slot.State{}
	rng := rand.New(rand.NewPCG(1, 2))
	var ids []string // every id acquired, held or not
	for round := range 400 {
		clock.Advance(time.Duration(rng.IntN(30_000)) * time.Microsecond)
		now := clock.Now().UnixMicro()
		calls := make([]*slotCall, 1+rng.IntN(6))
		for i := range calls {
			key := keys[rng.IntN(len(keys))]
			op := slot.Op{Kind: slot.OpKind(1 + rng.IntN(3))}
			if op.Kind == slot.Acquire && (len(ids) == 0 || rng.IntN(8) > 0) {
				var b [16]byte
				for j := range b {
					b[j] = byte(rng.Uint32())
				}
				op.ID = storekit.NewPermitID(key, b)
				ids = append(ids, op.ID)
			} else {
				if len(ids) == 0 {
					continue
				}
				op.ID = ids[len(ids)-1-rng.IntN(min(len(ids), 12))]
			}
			calls[i] = &slotCall{ctx: ctx, rkey: s.slotKey(key), op: op, spec: specs[rng.IntN(len(specs))]}
		}
		sent := calls[:0]
		for _, c := range calls {
			if c != nil {
				sent = append(sent, c)
			}
		}
		if len(sent) == 0 {
			continue
		}
		s.sendSlots(ctx, sent, nil)
		for i, c := range sent {
			key := keys[0]
			for _, k := range keys {
				if s.slotKey(k) == c.rkey {
					key = k
				}
			}
			if key == "bad" {
				if c.err == nil || errors.Is(c.err, slot.ErrInvalidPermit) {
					t.Fatalf("round %d op %d: %s on a string: %v, want a wrong type error", round, i, c.op.Kind, c.err)
				}
				continue
			}
			st, want, err := c.spec.Step(state[key], now, c.op)
			if err != nil {
				if !errors.Is(c.err, slot.ErrInvalidPermit) {
					t.Fatalf("round %d op %d: %s %q on %s: %+v, %v; want %v", round, i, c.op.Kind, c.op.ID, key, c.v, c.err, err)
				}
				continue
			}
			state[key] = st
			if c.err != nil || c.v != want {
				t.Fatalf("round %d op %d: %s %q on %s at %d: %+v, %v; want %+v", round, i, c.op.Kind, c.op.ID, key, now, c.v, c.err, want)
			}
		}
		for _, key := range keys[:2] {
			hold := state[key].Hold(now)
			ttl, err := admin.PTTL(ctx, s.slotKey(key)).Result()
			if err != nil {
				t.Fatal(err)
			}
			// Redis's TTL runs on its own clock, which the test's does
			// not move: the key must outlive its latest permit by the
			// injected clock's margin at least.
			if hold > 0 && ttl.Microseconds() < hold {
				t.Fatalf("round %d: %s lives %s, its latest permit %dµs", round, key, ttl, hold)
			}
		}
	}
}

// TestSlotPipelineTryAgainRunsOnce sends a Cluster master a batch of two
// slots' calls, as slotLead sends its callers' operations, the first slot
// refused with TRYAGAIN (two keys of a migrating slot, one of them there):
// the acquire beside it runs once (run again, it found its permit held
// already and failed), and its caller has its answer while the slot still
// migrates; the refused ones go again until the slot is settled, and are
// granted then. (TestPipelineTryAgainRunsOnce does the same for rate
// limits.)
func TestSlotPipelineTryAgainRunsOnce(t *testing.T) {
	cluster := redistest.StartCluster(t, 3)
	clock := storetest.NewClock(storetest.Base)
	s := New(cluster.Client(t), &Options{Prefix: "ta:", Clock: clock})
	t.Cleanup(func() { s.Close() })
	ctx := context.Background()
	master := s.masterOf(ctx, s.slotKey("a0"))
	slotOfKey := func(k string) int { return slotOf(s.slotKey(k)) }
	// moving: two keys of one slot; beside: a key of another slot of the
	// same master.
	moving, beside := []string{"a0"}, ""
	for j := 1; len(moving) < 2 || beside == ""; j++ {
		k := "a" + strconv.Itoa(j)
		switch {
		case slotOfKey(k) == slotOfKey("a0"):
			moving = append(moving, k)
		case beside == "" && s.masterOf(ctx, s.slotKey(k)) == master:
			beside = k
		}
	}
	spec := slot.Spec{Slots: 3, Lease: 60_000_000}
	acquires := func(keys ...string) []*slotCall {
		calls := make([]*slotCall, len(keys))
		for i, k := range keys {
			var b [16]byte
			b[0], b[1] = byte(i), byte(len(keys))
			calls[i] = &slotCall{ctx: ctx, rkey: s.slotKey(k), slot: slotOfKey(k), wake: make(chan bool, 1),
				op: slot.Op{Kind: slot.Acquire, ID: storekit.NewPermitID(k, b)}, spec: spec}
		}
		return calls
	}
	first := acquires(moving[0])
	s.sendSlots(ctx, first, nil)
	if first[0].err != nil {
		t.Fatal(first[0].err)
	}
	var admin *redis.Client
	var to string
	for _, srv := range cluster.Servers {
		if srv.Addr == master {
			admin = srv.Admin(t)
		} else {
			to = srv.Addr
		}
	}
	if err := admin.Do(ctx, "CLUSTER", "SETSLOT", slotOfKey(moving[0]), "MIGRATING", cluster.NodeID(t, to)).Err(); err != nil {
		t.Fatal(err)
	}
	// The first call leads, as slotDo's caller does.
	calls := acquires(moving[0], moving[1], beside)
	s.slotBatch.mu.Lock()
	s.slotBatch.inflight++
	s.slotBatch.mu.Unlock()
	led := make(chan struct{})
	go func() {
		defer close(led)
		s.slotLead(calls)
	}()
	t.Cleanup(func() { <-led }) // before the Store and the Cluster stop
	select {
	case <-calls[2].wake:
	case <-time.After(batchTimeout / 2):
		t.Fatal("the acquire beside the migrating slot's: no answer while the slot migrates")
	}
	if c := calls[2]; c.err != nil || !c.v.OK || c.v.Held != 1 {
		t.Errorf("the acquire beside them: %+v, %v; want done, 1 held", c.v, c.err)
	}
	if err := admin.Do(ctx, "CLUSTER", "SETSLOT", slotOfKey(moving[0]), "STABLE").Err(); err != nil {
		t.Fatal(err)
	}
	<-calls[1].wake
	<-led
	for i, c := range calls {
		if n := len(c.wake); n != 0 {
			t.Errorf("call %d woken %d times more (the leader never)", i, n)
		}
	}
	for i, want := range []int64{2, 1} {
		if c := calls[i]; c.err != nil || !c.v.OK || c.v.Held != want {
			t.Errorf("acquire %d in the slot, settled: %+v, %v; want done, %d held", i, c.v, c.err, want)
		}
	}
	for k, want := range map[string]int64{moving[0]: 2, moving[1]: 1, beside: 1} {
		if n, err := admin.ZCard(ctx, s.slotKey(k)).Result(); err != nil || n != want {
			t.Errorf("%s holds %d permits (%v), want %d", k, n, err, want)
		}
	}
}
