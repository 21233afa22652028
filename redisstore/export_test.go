package redisstore

import (
	"context"

	"github.com/floodgate/floodgate/core"
)

// SlotOf exports slotOf to the tests.
var SlotOf = slotOf

// DisableFastPath makes s send every decision through decide.lua, so that
// the tests can hold bucket.lua and decide.lua to the same results.
func (s *Store) DisableFastPath() { s.noFastPath = true }

// TakeBatch decides a request of cost n on each of keys with pol, a Policy
// that s prepared, all in one batch, as the batcher sends the requests
// that wait together, and returns each decision and its error.
func (s *Store) TakeBatch(ctx context.Context, pol core.Policy, keys []string, n int64) ([]core.Decision, []error) {
	p := pol.(*policy)
	calls := make([]*call, len(keys))
	for i, k := range keys {
		calls[i] = &call{ctx: ctx, p: p, keys: p.keys(k), n: n, now: s.nowArg(), specs: p.params, op: opTake}
	}
	s.send(ctx, calls)
	ds, errs := make([]core.Decision, len(keys)), make([]error, len(keys))
	for i, c := range calls {
		if errs[i] = c.err; c.err == nil {
			ds[i] = c.decision()
		}
	}
	return ds, errs
}
