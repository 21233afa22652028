package service

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/floodgate/floodgate"
	"github.com/floodgate/floodgate/internal/lib/arith"
)

// This file explains a concurrency rule on a key: its slots, as
// floodgate.Concurrency.Inspect sees them, and the rate rules an acquire
// decides with them, each as Explain explains it. Nothing is acquired or
// charged.

// ExplainConcurrency is a concurrency rule's slots on a key, in an
// Explanation. Times are milliseconds, rounded up.
type ExplainConcurrency struct {
	// Slots is N, the most permits held at once on the key (the local
	// share of it while a fallback's local store answers).
	Slots int64 `json:"slots"`
	// LeaseMs is how long a permit lives unless released or extended.
	LeaseMs int64 `json:"lease_ms"`
	// Held is how many permits are live now.
	Held int64 `json:"held"`
	// FreeInMs is the time until the earliest live permit expires: when
	// a slot frees at the latest, sooner if one is released; null when
	// none is held.
	FreeInMs *int64 `json:"free_in_ms"`
	// Local is the fallback's local store's permits of the key, in the
	// local mode: granted while Redis failed, held until released or
	// expired. Nil otherwise.
	Local *ExplainLocalSlots `json:"local,omitempty"`
	// FailOpen is the permits that this instance granted in the
	// fail-open mode while Redis failed, which Redis does not count: held
	// until released or expired, or until an extend moves one onto Redis.
	// Nil when there are none, and outside the fail-open mode.
	FailOpen *ExplainOpenSlots `json:"fail_open,omitempty"`
	// Rates are the rate rules an acquire decides with the slot, all or
	// nothing, each explained on the key.
	Rates []Explanation `json:"rates,omitempty"`
}

// ExplainLocalSlots is the fallback's local store's share of a
// concurrency rule on a key.
type ExplainLocalSlots struct {
	Slots    int64  `json:"slots"`
	Held     int64  `json:"held"`
	FreeInMs *int64 `json:"free_in_ms"`
}

// ExplainOpenSlots is the fail-open permits an instance remembers on a
// key.
type ExplainOpenSlots struct {
	Held     int64  `json:"held"`
	FreeInMs *int64 `json:"free_in_ms"`
}

func (s *Service) explainSlots(ctx context.Context, rule, key string) (Explanation, error) {
	r, err := s.slotRule(rule, key)
	if err != nil {
		return Explanation{}, err
	}
	in, err := r.c.Inspect(ctx, slotKey(rule, key))
	if err != nil {
		s.KeyFailed(rule, err)
		return Explanation{}, err
	}
	c := &ExplainConcurrency{Slots: in.Limit, LeaseMs: arith.RoundUp(r.c.Lease(), time.Millisecond), Held: in.Held, FreeInMs: freeIn(in.Held, in.FreeAfter)}
	e := Explanation{Rule: rule, Key: key, Limits: []ExplainLimit{}, Decides: -1, Concurrency: c}
	e.Allowed = in.Held < in.Limit && in.Source != floodgate.SourceFailClosed
	e.Store = ExplainStore{Name: "redis", Source: in.Source.String()}
	if _, ok := s.store.(*floodgate.MemoryStore); ok {
		e.Store.Name = "memory"
	}
	if fb := in.Fallback; fb != nil {
		e.Store.Fallback = &ExplainFallback{Mode: fb.Mode, Degraded: fb.Degraded, Share: fmt.Sprintf("1/%d", fb.Instances)}
		switch {
		case fb.LocalLimit > 0:
			c.Local = &ExplainLocalSlots{Slots: fb.LocalLimit, Held: fb.LocalHeld, FreeInMs: freeIn(fb.LocalHeld, fb.LocalFreeAfter)}
		case fb.Mode == "fail-open" && fb.LocalHeld > 0:
			c.FailOpen = &ExplainOpenSlots{Held: fb.LocalHeld, FreeInMs: freeIn(fb.LocalHeld, fb.LocalFreeAfter)}
		}
	}
	for _, rr := range r.rates {
		re, err := s.Explain(ctx, rr.Name, key)
		if err != nil {
			return Explanation{}, fmt.Errorf("rate rule %q of concurrency rule %q: %w", rr.Name, rule, err)
		}
		c.Rates = append(c.Rates, re)
		e.Allowed = e.Allowed && re.Allowed
	}
	e.Why = slotsWhy(&e)
	return e, nil
}

func freeIn(held int64, after time.Duration) *int64 {
	if held == 0 {
		return nil
	}
	ms := arith.RoundUp(after, time.Millisecond)
	return &ms
}

// slotsWhy writes a concurrency rule's sentences.
func slotsWhy(e *Explanation) []string {
	c := e.Concurrency
	w := []string{fmt.Sprintf("key %q is checked against concurrency rule %q: %s, each permit held until released, or for a lease of %s unless extended",
		e.Key, e.Rule, plural(int(c.Slots), "slot", "slots"), msText(c.LeaseMs))}
	held := fmt.Sprintf("%d of %d slots are held now", c.Held, c.Slots)
	if c.FreeInMs != nil {
		held += fmt.Sprintf("; the earliest permit expires in %s: a slot frees then at the latest, sooner if one is released", msText(*c.FreeInMs))
	}
	w = append(w, held)
	if len(c.Rates) > 0 {
		names := make([]string, len(c.Rates))
		for i, re := range c.Rates {
			names[i] = fmt.Sprintf("%q", re.Rule)
		}
		what := "rate rule "
		if len(names) > 1 {
			what = "rate rules "
		}
		w = append(w, "an acquire decides "+what+strings.Join(names, ", ")+" with the slot, all or nothing: a rate rule that denies gives the slot back")
		for _, re := range c.Rates {
			// The rate rule's own verdict, from its explanation.
			verdict := "a check of cost 1 would be allowed"
			if !re.Allowed {
				verdict = "a check of cost 1 would be denied"
			}
			for _, line := range re.Why {
				if strings.HasPrefix(line, "a check of cost 1 ") {
					verdict = line
				}
			}
			w = append(w, fmt.Sprintf("rate rule %q: %s", re.Rule, verdict))
		}
	}
	switch {
	case e.Store.Source == floodgate.SourceFailClosed.String():
		w = append(w, "an acquire would be denied: Redis is failing and the fallback fails closed")
	case c.Held >= c.Slots:
		w = append(w, fmt.Sprintf("an acquire would be denied: all %s held", plural(int(c.Slots), "slot is", "slots are")))
	case !e.Allowed:
		w = append(w, "an acquire would be denied by a rate rule, and would hold no slot")
	default:
		w = append(w, "an acquire would get a slot")
	}
	w = append(w, storeSentences(e.Store)...)
	if l := c.Local; l != nil && l.Held > 0 {
		w = append(w, fmt.Sprintf("this instance's local store holds %d of its %d slots on the key, granted while Redis failed: they are held until released or expired, whoever answers", l.Held, l.Slots))
	}
	if o := c.FailOpen; o != nil {
		w = append(w, fmt.Sprintf("this instance granted %s on the key while Redis failed (fail open), which Redis does not count: each is held until released or expired, or counted by Redis once an extend finds a free slot there", plural(int(o.Held), "permit", "permits")))
	}
	return w
}
