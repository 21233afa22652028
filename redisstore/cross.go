package redisstore

import (
	"context"
	_ "embed"
	"encoding/binary"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/floodgate/floodgate"
	"github.com/redis/go-redis/v9"
)

// This file batches across the slots of a Redis Cluster master: one
// script call carries the fast path's decisions for every slot of the
// master that a batch holds, where a script call per slot would carry one
// decision each once keys are many (10,000 keys rarely share a slot).
// Redis 7 lets a function registered with the flag allow-cross-slot-keys
// touch keys of any slot its node serves; its declared keys must still
// share one slot, so it declares none and takes its keys as arguments,
// as the library's _argkeys functions do (argKeysArgs): the one exception
// to declared keys (see protocol.go). The keys are the client's, as ever:
// each request's state key and override key, and each slot's probe key;
// the Lua builds none.
//
// Each slot of the call is checked by the script before anything of it
// is read or written (a probe key, see cross.lua): a slot that the node
// no longer serves, or is migrating, is refused whole, and its requests
// go again, once, as the per-slot path sends them, through the Cluster
// client, which follows MOVED and ASK to the slot's owner. A refused
// request was charged nothing, and its second try is its only charge. A
// call that Redis refused before running it (READONLY from a master
// demoted by a failover, CLUSTERDOWN, TRYAGAIN, LOADING), or that never
// reached it, is sent again the same way. A request on a key whose
// override the fast path does not decide is charged nothing by the call
// either: its record says so
// (RECORD_ELSEWHERE, with the override, whose keys it then declares), and
// it goes on to decide.lua with its slot's other such requests, which,
// like every decide.lua call, sends a request back for its override's
// keys ("?") and again with them (decideEngine). Where the Cluster lacks
// functions (Redis 6, a managed service that refuses FUNCTION LOAD), the
// Store batches per slot as before, and says so once in its log.

//go:embed cross.lua
var crossSource string

// crossCheck returns the Lua function that crossBatch calls with each
// part's keys before it runs a command of the part: the library's entry
// (scriptSet's, the key checker's in tests) on them, or nil for none.
func crossCheck(entry string) string {
	if entry == "" {
		return "nil"
	}
	return "function(keys)\n" + entry + "end"
}

// crossProbe is what the probe key of a slot adds to one of the slot's
// keys (the first of a request's, <prefix>{key}:0b): floodgate never
// writes a key ending so, and it keeps the key's hash tag.
const crossProbe = ":probe"

// The records of crossBatch's reply, one per slot (cross.lua).
const (
	crossDecided = 1 // the slot's records follow, after their length
	crossRefused = 2 // the node does not serve the slot: nothing was done
)

// crossState is a Cluster Store's cross-slot batching: on until the
// Cluster shows it lacks it.
type crossState struct {
	off     atomic.Bool
	offOnce sync.Once
	// refused counts the slots that masters refused (moved, migrating, a
	// demoted master), whose requests went again through the per-slot
	// path.
	refused atomic.Uint64
}

// crossOff turns cross-slot batching off for good, and logs why once.
func (s *Store) crossOff(why error) {
	s.cross.off.Store(true)
	s.cross.offOnce.Do(func() {
		s.logger.Warn("redisstore: the Redis Cluster does not take floodgate's cross-slot function; batching per slot, which carries fewer decisions per script call",
			"cause", why.Error())
	})
}

// crossPart is one slot's share of a cross-slot call.
type crossPart struct {
	group []*call // as grouped, to send again if refused
	frame         // the fast path's batch of them (bucketsEngine)
}

// sendCross sends, in one call of crossBatch to the master that the
// client's view of the Cluster gives for them, the groups (one slot each,
// of calls queued for one master) that the fast path decides, and
// returns the others, for the per-slot path. It returns groups untouched
// when cross-slot batching is off, or when fewer than two slots would go.
func (s *Store) sendCross(ctx context.Context, groups [][]*call) [][]*call {
	cc, ok := s.client.(*redis.ClusterClient)
	if !ok || s.cross.off.Load() || s.noFastPath {
		return groups
	}
	if s.noFunctions.Load() {
		s.crossOff(errNoFunctions)
		return groups
	}
	var parts []crossPart
	var rest [][]*call
	nargs := 0
	for _, g := range groups {
		if fast, _ := s.allFast(g); !fast {
			rest = append(rest, g)
			continue
		}
		f := bucketsEngine{}.encode(s, g)
		if slotOf(f.keys[0]+crossProbe) != slotOf(f.keys[0]) {
			rest = append(rest, g) // a key without a hash tag of its own (a prefix with "{}")
			continue
		}
		parts = append(parts, crossPart{group: g, frame: f})
		nargs += 1 + len(f.keys) + len(f.args)
	}
	if len(parts) < 2 {
		return groups
	}
	node, err := cc.MasterForKey(ctx, parts[0].calls[0].keys[0])
	if err != nil {
		return groups // no view of the Cluster yet: the per-slot path loads it
	}
	// FCALL's own arguments first (no keys declared: see argKeysArgs),
	// so that the command is argv itself, not a copy; then the parts'
	// sizes, in one argument rather than one each, as each argument
	// costs Redis a string for Lua.
	argv := make([]any, 4, 4+nargs)
	argv[0], argv[1], argv[2] = "fcall", s.scripts.crossFn, 0
	sizes := make([]byte, 0, 8*len(parts))
	for _, p := range parts {
		sizes = binary.BigEndian.AppendUint32(sizes, uint32(len(p.keys)))
		sizes = binary.BigEndian.AppendUint32(sizes, uint32(len(p.args)))
		argv = append(argv, p.keys[0]+crossProbe)
		for _, k := range p.keys {
			argv = append(argv, k)
		}
		argv = append(argv, p.args...)
	}
	argv[3] = sizes
	res, err := s.runCross(ctx, node, argv)
	if err != nil {
		var again [][]*call
		for _, p := range parts {
			again = append(again, p.group)
		}
		switch {
		case crossUnsupported(err):
			s.crossOff(err)
			return append(rest, again...)
		case notRun(err) || unsent(err):
			// Nothing ran: the per-slot path sends them to their owners.
			s.cross.refused.Add(uint64(len(parts)))
			cc.ReloadState(ctx)
			return append(rest, again...)
		}
		for _, p := range parts {
			for _, c := range p.calls {
				c.out, c.err = nil, s.wrap(c.ctx, err)
			}
			release(p.group)
		}
		return rest
	}
	decided, refused := 0, 0
	for _, p := range parts {
		if res == "" {
			res = "\x00" // too short: fails the part below
		}
		kind := res[0]
		res = res[1:]
		if kind == crossRefused {
			refused++
			rest = append(rest, p.group)
			continue
		}
		var part string
		if kind == crossDecided && len(res) >= 4 {
			n := uint64(res[0])<<24 | uint64(res[1])<<16 | uint64(res[2])<<8 | uint64(res[3])
			if n <= uint64(len(res)-4) {
				part, res = res[4:4+n], res[4+n:]
				decided += p.n
				s.crossDecoded(ctx, p, part, nil)
				continue
			}
		}
		res = ""
		s.crossDecoded(ctx, p, "", fmt.Errorf("%w: the cross-slot script returned a reply floodgate cannot read", floodgate.ErrStore))
	}
	s.counted(1, decided)
	if refused > 0 {
		s.cross.refused.Add(uint64(refused))
		cc.ReloadState(ctx)
	}
	return rest
}

// crossDecoded sets the results of part p's calls from its share of the
// reply (bucketBatch's reply, or err), sends on those that the fast path
// did not decide, and wakes p's callers.
func (s *Store) crossDecoded(ctx context.Context, p crossPart, res string, err error) {
	e := bucketsEngine{}
	e.read(s, p.frame, res, err)
	e.settle(ctx, s, p.frame)
	release(p.group)
}

// runCross sends the command argv, a call of crossBatch, to node,
// loading the library there first when it is missing (a new master, or
// one that was flushed), and returns its reply.
func (s *Store) runCross(ctx context.Context, node *redis.Client, argv []any) (string, error) {
	cmd := redis.NewCmd(ctx, argv...)
	_ = node.Process(ctx, onceCmd{cmd}) // the error is cmd's
	res, err := cmd.Text()
	if !functionMissing(err) {
		return res, err
	}
	if err := node.FunctionLoadReplace(ctx, s.scripts.libraryCode).Err(); err != nil {
		if isRedisError(err) {
			return "", fmt.Errorf("%w: loading the function library: %w", errCrossUnsupported, err)
		}
		return "", err
	}
	cmd = redis.NewCmd(ctx, argv...)
	_ = node.Process(ctx, onceCmd{cmd})
	return cmd.Text()
}

// errCrossUnsupported marks a Cluster master that refused the function
// library, which holds the cross-slot function.
var errCrossUnsupported = errors.New("redisstore: the function library was refused")

// errNoFunctions is why a Store whose scripts run with EVALSHA does not
// batch across slots: the cross-slot batch is a function.
var errNoFunctions = errors.New("the scripts run with EVALSHA: functions are disabled (Options.DisableFunctions), or the server lacks or refuses FCALL")

// crossUnsupported reports whether err says that the master cannot run
// the cross-slot function: FCALL refused (Redis 6, an ACL without it),
// or the library refused (an unknown flag, FUNCTION LOAD denied).
func crossUnsupported(err error) bool {
	return functionsRefused(err) || errors.Is(err, errCrossUnsupported)
}

// notRunPrefixes start the errors with which Redis refuses a command
// before running it: a replica (a master that a failover demoted), a
// redirection, a Cluster or a node not ready, a master without its
// replicas (min-replicas-to-write), a node busy with a script.
var notRunPrefixes = [...]string{"READONLY ", "MOVED ", "ASK ", "CLUSTERDOWN ", "TRYAGAIN ", "LOADING ", "MASTERDOWN ", "NOREPLICAS ", "BUSY "}

// notRun reports whether err is Redis refusing the call before it ran.
func notRun(err error) bool {
	if !isRedisError(err) {
		return false
	}
	msg := err.Error()
	for _, p := range notRunPrefixes {
		if strings.HasPrefix(msg, p) {
			return true
		}
	}
	return false
}
