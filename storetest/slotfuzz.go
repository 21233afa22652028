package storetest

import (
	"context"
	"fmt"
	"time"

	"github.com/floodgate/floodgate"
	"github.com/floodgate/floodgate/core/slot"
)

// slotReference is the simplest model of a concurrency limit, written
// apart from slot.Spec.Step to check it: per key, a map of permit ids
// to expiries in µs.
type slotReference struct {
	n, lease int64
	keys     map[string]map[string]int64
}

func (r *slotReference) live(key string, now int64) map[string]int64 {
	m := r.keys[key]
	if m == nil {
		m = map[string]int64{}
		r.keys[key] = m
	}
	for id, e := range m {
		if e <= now {
			delete(m, id)
		}
	}
	return m
}

func (r *slotReference) apply(key string, op slot.OpKind, id string, now int64) floodgate.SlotResult {
	m := r.live(key, now)
	var res floodgate.SlotResult
	switch op {
	case slot.Acquire:
		if int64(len(m)) < r.n {
			m[id] = now + r.lease
			res.Allowed, res.Permit = true, floodgate.Permit{Key: key, ID: id, Expires: time.UnixMicro(now + r.lease)}
		} else {
			first := int64(-1)
			for _, e := range m {
				if first < 0 || e < first {
					first = e
				}
			}
			res.RetryAfter = time.Duration(first-now) * time.Microsecond
		}
	case slot.Release:
		if _, ok := m[id]; ok {
			delete(m, id)
			res.Allowed = true
		}
	case slot.Extend:
		if e, ok := m[id]; ok {
			m[id] = max(e, now+r.lease)
			res.Allowed, res.Permit = true, floodgate.Permit{Key: key, ID: id, Expires: time.UnixMicro(m[id])}
		}
	}
	res.Held, res.Limit = int64(len(m)), r.n
	return res
}

// CheckSlotSequence decodes data into a concurrency limit and a sequence
// of acquires, releases and extends on three keys, with clock steps,
// runs it on a fresh store from newStore and on a
// simple reference model, and returns the first difference. It is the
// body of the fuzz tests that hold each store to the model. Stores that
// keep no concurrency limits return nil.
func CheckSlotSequence(newStore func(clock floodgate.Clock) floodgate.Store, data []byte) error {
	if len(data) < 2 {
		return nil
	}
	n := int64(data[0]%5) + 1
	lease := time.Duration(int64(data[1])%50+1) * time.Millisecond
	data = data[2:]
	clock := NewClock(Base)
	st := newStore(clock)
	defer st.Close()
	if _, ok := st.(slot.Store); !ok {
		return nil
	}
	c, err := floodgate.NewConcurrency(st, n, lease, nil)
	if err != nil {
		return err
	}
	ref := &slotReference{n: n, lease: lease.Microseconds(), keys: map[string]map[string]int64{}}
	keys := [...]string{"a", "b", "{c}"}
	var permits []floodgate.Permit
	ctx := context.Background()
	for i := 0; i+2 < len(data) && i < 3*200; i += 3 {
		b0, b1, b2 := data[i], data[i+1], data[i+2]
		// The clock moves by 0 to 23 sixteenths of the lease. Not back:
		// a permit that expired counts again when the clock steps back
		// until an operation drops it, and stores drop them at different
		// times (the memory store sweeps other keys as it goes); the
		// scenarios step back on one key, where every store agrees.
		clock.Advance(lease / 16 * time.Duration(b2%24))
		now := clock.Now().UnixMicro()
		kind := slot.OpKind(b0%3) + 1
		var got floodgate.SlotResult
		var p floodgate.Permit
		if kind == slot.Acquire {
			got, err = c.Acquire(ctx, keys[int(b0>>2)%len(keys)])
			if err != nil {
				return fmt.Errorf("op %d: acquire: %w", i/3, err)
			}
			p = got.Permit
			if got.Allowed {
				permits = append(permits, p)
			} else {
				p.Key, p.ID = keys[int(b0>>2)%len(keys)], "unused"
			}
		} else {
			if len(permits) == 0 {
				continue
			}
			p = permits[int(b1)%len(permits)]
			if kind == slot.Release {
				got, err = c.Release(ctx, p)
			} else {
				got, err = c.Extend(ctx, p)
			}
			if err != nil {
				return fmt.Errorf("op %d: %s: %w", i/3, kind, err)
			}
		}
		want := ref.apply(p.Key, kind, p.ID, now)
		if !got.Permit.Expires.Equal(want.Permit.Expires) || got.Allowed != want.Allowed || got.Held != want.Held ||
			got.RetryAfter != want.RetryAfter || got.Limit != want.Limit {
			return fmt.Errorf("op %d: %s on %s at %s: got %+v, want %+v", i/3, kind, p.Key, clock.Now().Sub(Base), got, want)
		}
	}
	return nil
}
