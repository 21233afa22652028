package service

import (
	"context"
	"fmt"
	"strconv"

	"github.com/floodgate/floodgate"
	"github.com/floodgate/floodgate/internal/server/config"
	"github.com/floodgate/floodgate/internal/server/metrics"
)

// slotRule is a configured concurrency rule, its Concurrency, and the
// rate rules decided with it.
type slotRule struct {
	config.Slots
	c     *floodgate.Concurrency
	rates []*rule
}

// SlotDecision is the outcome of an acquire, release or extend under a
// concurrency rule.
type SlotDecision struct {
	Rule   string
	Result floodgate.SlotResult
	// Rates are the rate rules decided with an acquire that got a slot,
	// in the concurrency rule's order; when one denied, the slot was given
	// back and Result is not Allowed.
	Rates []Decision
}

// slotKey is the store key of a client's key under a concurrency rule:
// "c<length of rule>:<rule>:<key>", apart from every rate rule's.
func slotKey(rule, key string) string {
	return "c" + strconv.Itoa(len(rule)) + ":" + rule + ":" + key
}

// prepareSlots makes the Concurrency of each of cfg's concurrency rules
// on the store.
func (s *Service) prepareSlots(cfg *config.Config, rs *ruleset) error {
	if len(cfg.Concurrency) == 0 {
		return nil
	}
	rs.slots = make(map[string]*slotRule, len(cfg.Concurrency))
	for _, sl := range cfg.Concurrency {
		c, err := floodgate.NewConcurrency(s.store, sl.Slots, sl.Lease, &floodgate.ConcurrencyOptions{Name: sl.Name})
		if err != nil {
			return fmt.Errorf("concurrency rule %q: %w", sl.Name, err)
		}
		r := &slotRule{Slots: sl, c: c}
		for _, name := range sl.Rules {
			r.rates = append(r.rates, rs.rules[name])
		}
		rs.slots[sl.Name] = r
	}
	return nil
}

func (s *Service) initSlots(m *metrics.Registry) {
	s.slotOps = m.NewCounterVec("floodgate_slot_operations_total",
		"Concurrency limit operations by rule, operation (acquire, release, extend) and outcome (granted, denied, released, extended, not_held, error).",
		"rule", "op", "outcome")
}

func (s *Service) slotRule(rule, key string) (*slotRule, error) {
	r, ok := s.rules.Load().slots[rule]
	if !ok {
		return nil, fmt.Errorf("%w %q (no concurrency rule of that name)", ErrUnknownRule, rule)
	}
	return r, checkKey(key)
}

// Acquire takes a slot on key under the concurrency rule called rule,
// and decides its rate rules with it, all or nothing.
func (s *Service) Acquire(ctx context.Context, rule, key string) (SlotDecision, error) {
	r, err := s.slotRule(rule, key)
	if err != nil {
		return SlotDecision{}, err
	}
	reqs := make([]floodgate.Request, len(r.rates))
	for i, rr := range r.rates {
		reqs[i] = floodgate.Request{Limiter: rr.lim, Key: rr.prefix + key, N: 1, Advisory: rr.Shadow}
	}
	res, err := floodgate.AcquireGroup(ctx, r.c, slotKey(rule, key), reqs)
	if err != nil {
		s.slotOps.Add(1, rule, "acquire", "error")
		s.KeyFailed(rule, err)
		return SlotDecision{}, err
	}
	d := SlotDecision{Rule: rule, Result: res}
	for i, rr := range r.rates {
		res := reqs[i].Result
		d.Rates = append(d.Rates, Decision{Rule: rr.Name, Shadow: rr.Shadow, Allowed: res.Allowed || rr.Shadow, Result: res, Limit: res.Name, Limits: rr.Limits})
	}
	if res.Allowed {
		s.slotOps.Add(1, rule, "acquire", "granted")
		if s.onAcquired != nil {
			s.onAcquired(rule, key)
		}
	} else {
		s.slotOps.Add(1, rule, "acquire", "denied")
		s.denied(rule, key)
	}
	return d, nil
}

// Release gives back the permit id on key under rule.
func (s *Service) Release(ctx context.Context, rule, key, id string) (SlotDecision, error) {
	return s.slotOp(ctx, rule, key, id, "release", "released")
}

// Extend renews the permit id on key under rule for another lease.
func (s *Service) Extend(ctx context.Context, rule, key, id string) (SlotDecision, error) {
	return s.slotOp(ctx, rule, key, id, "extend", "extended")
}

func (s *Service) slotOp(ctx context.Context, rule, key, id, op, done string) (SlotDecision, error) {
	r, err := s.slotRule(rule, key)
	if err != nil {
		return SlotDecision{}, err
	}
	p := floodgate.Permit{Key: slotKey(rule, key), ID: id}
	var res floodgate.SlotResult
	if op == "release" {
		res, err = r.c.Release(ctx, p)
	} else {
		res, err = r.c.Extend(ctx, p)
	}
	if err != nil {
		if !floodgate.IsInvalidInput(err) {
			s.slotOps.Add(1, rule, op, "error")
			s.KeyFailed(rule, err)
		}
		return SlotDecision{}, err
	}
	outcome := done
	if !res.Allowed {
		outcome = "not_held"
	}
	s.slotOps.Add(1, rule, op, outcome)
	return SlotDecision{Rule: rule, Result: res}, nil
}
