package fallback

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"

	"github.com/floodgate/floodgate"
	"github.com/floodgate/floodgate/core"
)

// This file is the ledger: the keys the local limiter admitted on while
// the primary failed, and their settling with the primary when it is back.

// MaxLedgerKeys is how many keys with local admissions a Store keeps for
// settling with the primary when it is back. Admissions on more keys than
// that during one outage are counted in Stats.Unsettled.
const MaxLedgerKeys = 100_000

// settleWorkers is how many charges a Store sends to the primary at once
// when it settles its ledger.
const settleWorkers = 16

// ledgerKey is a key with local admissions to settle, and its policy.
type ledgerKey struct {
	p   *policy
	key string
	b   *breaker // of the key's partition
}

// record notes in the ledger that key admitted n units locally, to be
// settled with the primary when it is back.
func (p *policy) record(key string, n int64, b *breaker) {
	s := p.s
	k := ledgerKey{p, key, b}
	s.ledgMu.Lock()
	if _, ok := s.pending[k]; !ok {
		if len(s.pending) >= MaxLedgerKeys {
			s.ledgMu.Unlock()
			s.stats.unsettled.Add(uint64(n))
			return
		}
		s.pending[k] = struct{}{}
	}
	s.ledgMu.Unlock()
}

// settle settles the keys of the ledger in b's partition with the
// primary (see policy.settle). It returns the first error; the keys it
// could not settle stay in the ledger.
func (b *breaker) settle(ctx context.Context) error {
	s := b.s
	s.ledgMu.Lock()
	keys := make([]ledgerKey, 0, len(s.pending))
	for k := range s.pending {
		if k.b == b {
			keys = append(keys, k)
		}
	}
	s.ledgMu.Unlock()
	if len(keys) == 0 {
		return nil
	}
	// The first error, kept once: errors of different types (a wrapped
	// ErrStore, a context's) cannot share an atomic.Value, which panics
	// on a second value of another type even where it would not store it.
	var (
		wg     sync.WaitGroup
		next   atomic.Int64
		failed atomic.Bool
		once   sync.Once
		first  error
	)
	for range min(settleWorkers, len(keys)) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1)) - 1
				if i >= len(keys) || failed.Load() {
					return
				}
				if err := keys[i].p.settle(ctx, keys[i]); err != nil {
					once.Do(func() { first = err; failed.Store(true) })
					return
				}
			}
		}()
	}
	wg.Wait()
	return first
}

// settle brings key down on the primary to what the local limiter has
// left, scaled from its share: it charges the primary the remaining it
// holds beyond Instances times the local remaining. That covers what was
// admitted locally (the local limiter started from the primary's state
// and counted it), and a primary that lost the key (a restart without
// persistence) as well. It takes the key out of the ledger first and puts
// it back if the primary fails, so that admissions recorded meanwhile are
// not lost.
func (p *policy) settle(ctx context.Context, k ledgerKey) error {
	s := p.s
	s.ledgMu.Lock()
	_, ok := s.pending[k]
	delete(s.pending, k)
	s.ledgMu.Unlock()
	if !ok {
		return nil
	}
	err := p.settleKey(ctx, k.key, k.b)
	if errors.Is(err, floodgate.ErrKey) {
		// The primary cannot settle this key until someone repairs it:
		// keeping it would fail every probe, and keep every key on the
		// mode, for one key.
		s.stats.keyErrors.Add(1)
		s.logKeyError("floodgate: dropped a key from the ledger unsettled: the primary fails on it alone", k.key, err)
		return nil
	}
	if err != nil {
		p.record(k.key, 0, k.b)
	}
	return err
}

func (p *policy) settleKey(ctx context.Context, key string, b *breaker) error {
	s := p.s
	l, err := p.local.Take(ctx, key, 0)
	if err != nil {
		return err
	}
	r, err := b.call(ctx, func(ctx context.Context) (core.Decision, error) {
		return p.primary.Take(ctx, key, 0)
	})
	if err != nil {
		return err
	}
	over := r.Remaining - l.Remaining*s.instances
	if over <= 0 {
		return nil
	}
	if _, err := b.call(ctx, func(ctx context.Context) (core.Decision, error) {
		return p.primary.Charge(ctx, key, over)
	}); err != nil {
		return err
	}
	s.stats.settled.Add(uint64(over))
	return nil
}
