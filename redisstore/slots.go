package redisstore

import (
	"context"
	"strings"
	"sync"

	"github.com/redis/go-redis/v9"
)

// slotOf returns the Redis Cluster slot of key: CRC16 of its hash tag (the
// part between the first { and the next }, when not empty) modulo 16384.
func slotOf(key string) int {
	if s := strings.IndexByte(key, '{'); s >= 0 {
		if e := strings.IndexByte(key[s+1:], '}'); e > 0 {
			key = key[s+1 : s+1+e]
		}
	}
	var crc uint16
	for i := 0; i < len(key); i++ {
		crc = crc<<8 ^ crc16Table[byte(crc>>8)^key[i]]
	}
	return int(crc) & 16383
}

// crc16Table is CRC-16/XMODEM (polynomial 0x1021), which Redis Cluster
// uses for key slots.
var crc16Table = func() (t [256]uint16) {
	for i := range t {
		crc := uint16(i) << 8
		for range 8 {
			if crc&0x8000 != 0 {
				crc = crc<<1 ^ 0x1021
			} else {
				crc <<= 1
			}
		}
		t[i] = crc
	}
	return t
}()

// groupBySlot splits calls by the Cluster slot of their keys, in the order
// the slots first appear: one script call each.
func groupBySlot(calls []*call) [][]*call {
	bySlot := map[int][]*call{}
	var order []int
	for _, c := range calls {
		if _, ok := bySlot[c.slot]; !ok {
			order = append(order, c.slot)
		}
		bySlot[c.slot] = append(bySlot[c.slot], c)
	}
	groups := make([][]*call, len(order))
	for i, slot := range order {
		groups[i] = bySlot[slot]
	}
	return groups
}

// masterOf returns the address of the Cluster master that holds key, as
// the client's view of the cluster has it, or "" when that is not known
// (outside a Cluster, or before the client could load its view).
func (s *Store) masterOf(ctx context.Context, key string) string {
	cc, ok := s.client.(*redis.ClusterClient)
	if !ok {
		return ""
	}
	node, err := cc.MasterForKey(ctx, key)
	if err != nil {
		return ""
	}
	return node.Options().Addr
}

// sendPipeline runs calls, whose keys a Cluster's client expects on one
// master: the fast path's, of every slot, in one script call across the
// slots (sendCross); where that is off, or for the slots that the master
// refused, in one round trip, a pipeline of one script call of the fast
// path per slot. The slots whose calls the fast path cannot decide, and
// every slot when Redis does not take functions, go as send would send
// them, side by side with the pipeline. It sets every call's result and
// wakes its caller.
func (s *Store) sendPipeline(ctx context.Context, calls []*call) {
	groups := groupBySlot(calls)
	if len(groups) == 1 {
		s.sendGroups(ctx, groups)
		return
	}
	if groups = s.sendCross(ctx, groups); len(groups) == 0 {
		return
	}
	type piped struct {
		e     engine
		f     frame   // its calls in the order the script reads them
		group []*call // as grouped, to send alone if the function is missing
		cmd   *redis.Cmd
	}
	var ps []piped
	var alone [][]*call
	pipe := s.client.Pipeline()
	for _, g := range groups {
		e := s.engineFor(g)
		if _, slow := e.(decideEngine); slow || s.noFunctions.Load() {
			alone = append(alone, g)
			continue
		}
		f := e.encode(s, g)
		cmd := fcallCmd(ctx, s.scripts.fns[e.entry()], f.keys, f.args)
		_ = pipe.Process(ctx, onceCmd{cmd})
		ps = append(ps, piped{e: e, f: f, group: g, cmd: cmd})
	}
	var wg sync.WaitGroup
	if len(alone) > 0 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s.sendGroups(ctx, alone)
		}()
	}
	if len(ps) > 0 {
		pipe.Exec(ctx) // each command keeps its own reply or error
		var again [][]*call
		loaded := false
		scripts, decisions := 0, 0
		for _, p := range ps {
			if err := p.cmd.Err(); sendAgain(err) {
				// Refused before it ran: a slot that is moving, or a
				// master not ready. Sent again on its own, where run
				// waits for the move to end. (A call that never reached
				// its master, go-redis's pipeline sends again itself;
				// its error may outlast a later send, so unsent's
				// errors do not go again here.)
				again = append(again, p.group)
				continue
			} else if functionMissing(err) || functionsRefused(err) {
				// Not loaded on this master (a new one, or flushed), or
				// refused: sent again on its own, where run decides how,
				// once the library is loaded (once for the pipeline,
				// rather than by each slot's call).
				if functionMissing(err) && !loaded {
					s.loadLibrary(ctx) // if it fails, run tries again and says why
					loaded = true
				}
				again = append(again, p.group)
				continue
			}
			scripts, decisions = scripts+1, decisions+p.f.n
			s.traceSent(p.f.calls, p.f.n)
			p.e.decode(s, p.f, p.cmd)
			p.e.settle(ctx, s, p.f)
			release(p.group)
		}
		if scripts > 0 {
			s.counted(scripts, decisions)
		}
		if len(again) > 0 {
			s.sendGroups(ctx, again)
		}
	}
	wg.Wait()
}
