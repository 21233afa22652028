package redisstore

import (
	"context"
	_ "embed"
	"fmt"
	"strings"
	"sync"

	"github.com/floodgate/floodgate/core"
)

// declaredChecker is the tests' checker of the keys the scripts name (see
// testdata/declared.lua).
//
//go:embed testdata/declared.lua
var declaredChecker string

// The Lua of prelude.lua's init that binds the scripts' commands, and
// what the checked scripts bind instead.
const (
	redisCalls   = "redis.call, redis.pcall"
	checkedCalls = "checkedCall, checkedPcall"
)

// checkedScripts are the scripts with the checker: every command they
// send is checked against the call's keys.
var checkedScripts = sync.OnceValue(func() *scriptSet {
	if n := strings.Count(preludeSource, redisCalls); n != 1 {
		panic(fmt.Sprintf("prelude.lua names %q %d times, want once, in init: the key checker binds its own there", redisCalls, n))
	}
	return newScriptSet(declaredChecker+strings.Replace(preludeSource, redisCalls, checkedCalls, 1), "checkKeys(keys)")
})

// CheckDeclaredKeys makes s run the scripts with a checker that fails a
// script call which names a key it did not declare (testdata/declared.lua),
// as Dragonfly does. Call it before s decides anything.
func (s *Store) CheckDeclaredKeys() { s.scripts = checkedScripts() }

// PassKeysAsArgs makes s pass the keys of its batches' calls (the fast
// path's and decide.lua's) as arguments, as a Cluster call across slots
// does (argKeysArgs).
func (s *Store) PassKeysAsArgs() { s.argKeys = true }

// DeclaredChecker returns the checker's Lua, and the checked library's
// code.
func DeclaredChecker() (checker, library string) {
	return declaredChecker, checkedScripts().libraryCode
}

// SlotOf exports slotOf to the tests.
var SlotOf = slotOf

// DisableFastPath makes s send every decision through decide.lua, so that
// the tests can hold bucket.lua and decide.lua to the same results.
func (s *Store) DisableFastPath() { s.noFastPath = true }

// DisableCrossSlot makes s batch per Cluster slot, as where a Cluster
// lacks the cross-slot function.
func (s *Store) DisableCrossSlot() { s.cross.off.Store(true) }

// CrossRefused returns how many slots Cluster masters refused in
// cross-slot calls, whose requests went again through the per-slot path.
func (s *Store) CrossRefused() uint64 { return s.cross.refused.Load() }

// TakeBatch decides a request of cost n on each of keys with pol, a Policy
// that s prepared, all in one batch, as the batcher sends the requests
// that wait together, and returns each decision and its error.
func (s *Store) TakeBatch(ctx context.Context, pol core.Policy, keys []string, n int64) ([]core.Decision, []error) {
	ds, errs, _, _ := s.TakeBatchGroup(ctx, pol, keys, nil, n)
	return ds, errs
}

// TakeBatchGroup is TakeBatch with a group (not all or nothing) of
// requests of cost n on group's keys at the start of the batch: it
// returns the group's decisions and error too.
func (s *Store) TakeBatchGroup(ctx context.Context, pol core.Policy, keys, group []string, n int64) ([]core.Decision, []error, []core.Decision, error) {
	newCall := func(k string) *call { return s.testCall(ctx, pol, k, n) }
	var calls, members []*call
	if len(group) > 0 {
		for _, k := range group {
			members = append(members, newCall(k))
		}
		calls = s.groupCalls(ctx, members, false)
	}
	ng := len(calls)
	for _, k := range keys {
		calls = append(calls, newCall(k))
	}
	s.send(ctx, calls)
	ds, errs := decisions(calls[ng:])
	var gds []core.Decision
	var gerr error
	for _, c := range calls[:ng] {
		if c.err != nil && gerr == nil {
			gerr = c.err
		}
	}
	for _, m := range members {
		if gerr != nil {
			break // the members have no decisions
		}
		gds = append(gds, m.decision())
	}
	return ds, errs, gds, gerr
}

// Batch sends, in one batch, a request on each of keys with pol, a Policy
// that s prepared: one that takes ns[i], or for ns[i] < 0 gives -ns[i]
// back. It returns each decision and its error, and whether the batch
// went through the fast path (bucket.lua).
func (s *Store) Batch(ctx context.Context, pol core.Policy, keys []string, ns []int64) ([]core.Decision, []error, bool) {
	calls := make([]*call, len(keys))
	for i, k := range keys {
		calls[i] = s.testCall(ctx, pol, k, ns[i])
		if ns[i] < 0 {
			calls[i].n, calls[i].op = -ns[i], opRefund
		}
	}
	fast, _ := s.allFast(calls)
	s.send(ctx, calls)
	ds, errs := decisions(calls)
	return ds, errs, fast && !s.noFastPath
}

// TakePipeline decides a request of cost n on each of keys with pol, a
// Policy that s prepared, all in one pipeline of a script call per slot,
// as the batcher sends a Cluster master's queued calls, and returns each
// decision and its error.
func (s *Store) TakePipeline(ctx context.Context, pol core.Policy, keys []string, n int64) ([]core.Decision, []error) {
	calls := make([]*call, len(keys))
	for i, k := range keys {
		calls[i] = s.testCall(ctx, pol, k, n)
		calls[i].slot = slotOf(calls[i].keys[0])
	}
	s.sendPipeline(ctx, calls)
	return decisions(calls)
}

// testCall returns a call that takes n on key with pol, a Policy that s
// prepared.
func (s *Store) testCall(ctx context.Context, pol core.Policy, key string, n int64) *call {
	p := pol.(*policy)
	c := &call{ctx: ctx, p: p, n: n, now: s.nowArg(), specs: p.params, op: opTake}
	p.setKeys(c, key)
	return c
}

// decisions returns each of calls' decision and error.
func decisions(calls []*call) ([]core.Decision, []error) {
	ds, errs := make([]core.Decision, len(calls)), make([]error, len(calls))
	for i, c := range calls {
		if errs[i] = c.err; c.err == nil {
			ds[i] = c.decision()
		}
	}
	return ds, errs
}
