package redisstore

import (
	"context"

	"github.com/redis/go-redis/v9"
)

// This file is the pipeline that every decision sent to Redis goes
// through:
//
//	lease → denial cache → batch → encode → run → decode → settle
//
// policy.take asks the key's lease (lease.go), then takeRedis the denial
// cache (denials.go), and the batcher (batch.go) gathers the calls that
// go together; the rest is exec's, over an engine: one of the scripts'
// entry points that decide calls (bucketOne, bucketBatch, decideBatch),
// with its codec. encode makes the batch one script call's keys and
// arguments, run sends it (FCALL or EVALSHA, see fastpath.go), decode
// reads the reply into the calls, and settle sends on what the reply
// sends elsewhere or again, and records what it taught. A Cluster's
// pipeline of a script call per slot (slots.go) and its call across
// slots (cross.go) carry the same frames and decode and settle them
// with the same engines; they differ only in how the frames travel.
// (The concurrency limits' slots.lua, concurrency.go, is apart: it
// decides no call.)

// engine is one of the scripts' entry points and its codec (protocol.go
// describes the bytes). An interface of stateless types rather than a
// struct of functions: the engines refer to one another (the fast
// path's settle hands calls on to decide.lua's), which package variables
// holding functions cannot do without an initialization cycle.
type engine interface {
	// entry is the script and function that run the engine's calls.
	entry() entry
	// encode returns calls, whose keys share a slot, as one script call.
	encode(s *Store, calls []*call) frame
	// decode sets the result of each call of f from the reply cmd. A call
	// that settle must send on keeps an error that says where:
	// errNotFast (to decide.lua), errUndeclared (again, with its
	// override's keys).
	decode(s *Store, f frame, cmd *redis.Cmd)
	// settle sends on the calls of f that decode marked, and records what
	// the reply taught of the keys' overrides (foreignKeys).
	settle(ctx context.Context, s *Store, f frame)
}

// frame is one script call of an engine: calls in the order the script
// answers them, the keys it declares and its arguments, and how many
// requests the calls hold (a group's members each).
type frame struct {
	calls []*call
	keys  []string
	args  []any
	n     int
}

// exec decides calls, whose keys share a slot, with e: one script call,
// then what its reply sends on.
func (s *Store) exec(ctx context.Context, e engine, calls []*call) {
	e.settle(ctx, s, s.trip(ctx, e, calls))
}

// trip is one script call of e for calls: encoded, counted in the Stats
// and the calls' spans, run and decoded. It returns the frame it sent.
func (s *Store) trip(ctx context.Context, e engine, calls []*call) frame {
	f := e.encode(s, calls)
	s.counted(1, f.n)
	s.traceSent(f.calls, f.n)
	e.decode(s, f, s.run(ctx, e.entry(), f.keys, f.args))
	return f
}

// engineFor returns the engine that decides calls, whose keys share a
// slot: the fast path when it decides every one of them (allFast), a
// lone request alone and any other batch in one call of bucketBatch
// rather than as a pipeline of one call each (one call costs both sides
// less per decision: bench's redisbench, 8 goroutines); decide.lua
// otherwise.
func (s *Store) engineFor(calls []*call) engine {
	fast, groups := s.allFast(calls)
	switch {
	case !fast || s.noFastPath:
		return decideEngine{}
	case len(calls) == 1 && !groups:
		return bucketEngine{}
	}
	return bucketsEngine{}
}
