package redisstore

import (
	"context"
	"errors"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/floodgate/floodgate/core/slot"
	"github.com/floodgate/floodgate/internal/lib/storekit"
	"github.com/floodgate/floodgate/internal/testkit/redistest"
	"github.com/floodgate/floodgate/storetest"
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
		s.sendSlots(ctx, sent)
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
