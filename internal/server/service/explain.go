package service

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/floodgate/floodgate"
	"github.com/floodgate/floodgate/internal/lib/arith"
)

// This file is the explanation of a rule's decisions on a key: what the
// explain API (GET /v1/explain, FG.EXPLAIN, and the dashboard's "inspect
// a key") answers, from floodgate.Limiter.Inspect, charging nothing.
// Package envoy explains Envoy's requests with the same pieces.

// Explanation says why a check of a key under a rule is decided as it
// is now. Times are milliseconds, rounded up.
type Explanation struct {
	Rule string `json:"rule"`
	Key  string `json:"key"`
	// Shadow reports that the rule is in shadow mode: it counts what it
	// would deny and denies nothing.
	Shadow bool `json:"shadow"`
	// Override is the key's override, when it has one: its limits are
	// in force in place of the rule's.
	Override *ExplainOverride `json:"override,omitempty"`
	// Limits are the limits in force, each with its state now.
	Limits []ExplainLimit `json:"limits"`
	// Decides is the index in Limits of the limit that decides: the one
	// closest to denying, as a check reports it; -1 for a concurrency
	// rule.
	Decides int `json:"decides"`
	// Concurrency is set when Rule is a concurrency rule: its slots on
	// the key, and the rate rules an acquire decides with them. Limits is
	// then empty.
	Concurrency *ExplainConcurrency `json:"concurrency,omitempty"`
	// Allowed says whether a check of cost 1 would pass every limit now,
	// by the limits alone: a shadow rule (Shadow) lets a request through
	// even when it is false. For a concurrency rule, whether an acquire
	// would get a slot and pass its rate rules.
	Allowed bool `json:"allowed"`
	// Store says what answers for the key.
	Store ExplainStore `json:"store"`
	// Why is the explanation in sentences, for people.
	Why []string `json:"why"`
}

// ExplainOverride is a key's override in an Explanation.
type ExplainOverride struct {
	// TTLMs is the time it has left; 0 for ever.
	TTLMs int64 `json:"ttl_ms"`
}

// ExplainLimit is one limit in force and its state.
type ExplainLimit struct {
	Index     int    `json:"index"`
	Name      string `json:"name,omitempty"`
	Algorithm string `json:"algorithm"`
	Summary   string `json:"summary"`
	// From is "rule" or "override": whose limit it is.
	From string `json:"from"`
	// Quota is the most the limit admits at once; Remaining what it
	// would admit now.
	Quota     int64 `json:"quota"`
	Remaining int64 `json:"remaining"`
	// ResetAfterMs is the time until the limit is full again.
	ResetAfterMs int64 `json:"reset_after_ms"`
	// RetryAfterMs is the time until the limit admits a request of cost
	// 1: 0 while it has 1 left; for a window with nothing left, the end
	// of the window; null when a look that charges nothing cannot tell
	// (a bucket or a sliding limit with nothing left: at most
	// ResetAfterMs).
	RetryAfterMs *int64 `json:"retry_after_ms"`
	// Decides marks the limit that decides.
	Decides bool `json:"decides,omitempty"`
}

// ExplainStore says which store answers for a key, and what this
// instance holds of it.
type ExplainStore struct {
	// Name is "memory" (the embedded store) or "redis".
	Name string `json:"name"`
	// Source is who answers the key's checks now: "store", or while
	// Redis fails, the fallback's "local", "fail-open" or "fail-closed".
	Source string `json:"source"`
	// LeaseUnits is how many units this instance holds of a lease on the
	// key: taken from Redis already, admitted here without asking it.
	LeaseUnits int64 `json:"lease_units,omitempty"`
	// DenialCached reports that this instance caches a denial of the
	// key: the same request is denied without asking Redis until its
	// retry.
	DenialCached bool `json:"denial_cached,omitempty"`
	// Fallback is the fallback in front of Redis; nil without one.
	Fallback *ExplainFallback `json:"fallback,omitempty"`
}

// ExplainFallback is the fallback's part in an ExplainStore.
type ExplainFallback struct {
	// Mode is "local", "fail-open" or "fail-closed".
	Mode string `json:"mode"`
	// Degraded reports that Redis is failing for the key: the mode
	// answers.
	Degraded bool `json:"degraded"`
	// Share is the share of each limit the local limiter applies:
	// "1/<instances>".
	Share string `json:"share"`
	// Local is the local limiter's state of each limit's share, in the
	// local mode.
	Local []ExplainLimit `json:"local,omitempty"`
}

// Explain tells why a check of key under rule is decided as it is now,
// from the state of every limit in force, and charges nothing. Its errors
// wrap ErrBadRequest (no rule, a bad key), ErrUnknownRule, or are the
// store's; a store that cannot inspect a key gives one wrapping
// errors.ErrUnsupported.
func (s *Service) Explain(ctx context.Context, rule, key string) (Explanation, error) {
	if rule == "" {
		return Explanation{}, fmt.Errorf("%w: rule is required", ErrBadRequest)
	}
	if _, ok := s.rules.Load().slots[rule]; ok {
		return s.explainSlots(ctx, rule, key)
	}
	r, err := s.lookup(rule, key)
	if err != nil {
		return Explanation{}, err
	}
	in, err := r.lim.Inspect(ctx, r.prefix+key)
	if err != nil {
		s.KeyFailed(rule, err)
		return Explanation{}, err
	}
	e := Explanation{Rule: rule, Key: key, Shadow: r.Shadow}
	if in.Overridden {
		o, ok, err := r.lim.GetOverride(ctx, r.prefix+key)
		if err != nil {
			return Explanation{}, err
		}
		if ok {
			e.Override = &ExplainOverride{TTLMs: arith.RoundUp(o.TTL, time.Millisecond)}
		} else {
			// It expired between the two reads: the limits are its still.
			e.Override = &ExplainOverride{}
		}
	}
	from := "rule"
	if in.Overridden {
		from = "override"
	}
	e.Limits = ExplainLimits(in.Limits, in.Results, from)
	e.Decides = in.Index
	if e.Decides >= 0 && e.Decides < len(e.Limits) {
		e.Limits[e.Decides].Decides = true
	}
	e.Allowed = true
	for _, l := range e.Limits {
		e.Allowed = e.Allowed && l.Remaining >= 1
	}
	e.Store = s.ExplainStore(&in)
	e.Why = s.why(&e)
	return e, nil
}

// ExplainLimits describes limits and their states (results, one per
// limit), all from from ("rule", "override" or "local").
func ExplainLimits(limits []floodgate.Limit, results []floodgate.Result, from string) []ExplainLimit {
	out := make([]ExplainLimit, len(limits))
	for i, l := range limits {
		r := results[i]
		out[i] = ExplainLimit{Index: i, Name: l.Name(), Algorithm: l.Algorithm().String(), Summary: l.String(), From: from,
			Quota: r.Quota, Remaining: r.Remaining, ResetAfterMs: arith.RoundUp(r.ResetAfter, time.Millisecond)}
		out[i].RetryAfterMs = retryOfOne(l, r)
	}
	return out
}

// retryOfOne is how long until limit l, in the state r of a peek, admits
// a request of cost 1, when a peek tells it: at once with 1 left, at the
// end of a fixed window with none; nil otherwise, since a bucket's or a
// sliding limit's next unit depends on state that a peek does not show.
func retryOfOne(l floodgate.Limit, r floodgate.Result) *int64 {
	var ms int64
	switch {
	case r.Remaining >= 1:
	case r.Quota < 1:
		ms = -1 // never
	case l.Algorithm() == floodgate.AlgorithmFixedWindow:
		ms = arith.RoundUp(r.ResetAfter, time.Millisecond)
	default:
		return nil
	}
	return &ms
}

// ExplainStore describes what answered an inspection, in.
func (s *Service) ExplainStore(in *floodgate.Inspection) ExplainStore {
	st := ExplainStore{Name: "redis", Source: in.Source.String(), LeaseUnits: in.Lease, DenialCached: in.DenialCached}
	if _, ok := s.store.(*floodgate.MemoryStore); ok {
		st.Name = "memory"
	}
	if fb := in.Fallback; fb != nil {
		st.Fallback = &ExplainFallback{Mode: fb.Mode, Degraded: fb.Degraded, Share: "1/" + strconv.FormatInt(fb.Instances, 10)}
		if fb.Local != nil {
			st.Fallback.Local = ExplainLimits(in.Limits, fb.Local, "local")
		}
	}
	return st
}

// why writes e's sentences.
func (s *Service) why(e *Explanation) []string {
	var w []string
	n := len(e.Limits)
	whose := fmt.Sprintf("rule %q", e.Rule)
	if e.Override != nil {
		ttl := "for ever"
		if e.Override.TTLMs > 0 {
			ttl = "for " + msText(e.Override.TTLMs) + " more"
		}
		w = append(w, fmt.Sprintf("key %q has an override, %s: its %s in force in place of rule %q's", e.Key, ttl, plural(n, "limit is", "limits are"), e.Rule))
		whose = "the override"
	} else {
		w = append(w, fmt.Sprintf("key %q is checked against rule %q: %s", e.Key, e.Rule, plural(n, "limit", "limits, checked as one")))
	}
	if e.Shadow {
		w = append(w, "the rule is in shadow mode: it counts what it would deny (as shadow_denied) and lets every request through")
	}
	for _, l := range e.Limits {
		w = append(w, limitSentence(whose, l))
	}
	d := e.Limits[e.Decides]
	switch {
	case e.Allowed:
		w = append(w, fmt.Sprintf("a check of cost 1 would be allowed; limit %d decides, with %d left, the fewest", d.Index, d.Remaining))
	case e.Shadow:
		w = append(w, fmt.Sprintf("a check of cost 1 would be denied by limit %d, but the rule is in shadow mode: it is let through", d.Index))
	default:
		w = append(w, fmt.Sprintf("a check of cost 1 would be denied by limit %d%s", d.Index, retryText(d.RetryAfterMs, d.ResetAfterMs)))
	}
	w = append(w, storeSentences(e.Store)...)
	return w
}

// limitSentence says l's state; its summary names it, when it has a name.
func limitSentence(whose string, l ExplainLimit) string {
	full := "full"
	if l.ResetAfterMs > 0 {
		full = "full again in " + msText(l.ResetAfterMs)
	}
	return fmt.Sprintf("limit %d of %s (%s): %d of %d left, %s", l.Index, whose, l.Summary, l.Remaining, l.Quota, full)
}

func retryText(retry *int64, reset int64) string {
	switch {
	case retry == nil:
		return ", which admits 1 again within " + msText(reset)
	case *retry < 0:
		return ", which never admits it"
	}
	return ", which admits 1 again in " + msText(*retry)
}

func storeSentences(st ExplainStore) []string {
	var w []string
	fb := st.Fallback
	switch {
	case st.Name == "memory":
		w = append(w, "the embedded memory store of this instance answers")
	case fb != nil && fb.Degraded:
		what := map[string]string{"local": "a local limiter with " + fb.Share + " of each limit", "fail-open": "fail-open: every request is allowed", "fail-closed": "fail-closed: every request is denied"}[fb.Mode]
		w = append(w, "Redis is failing for this key: the fallback answers, "+what)
	default:
		w = append(w, "Redis answers, shared by every instance")
		if fb != nil {
			w = append(w, fmt.Sprintf("if Redis fails, the fallback answers: %s", map[string]string{"local": "a local limiter with " + fb.Share + " of each limit", "fail-open": "fail-open", "fail-closed": "fail-closed"}[fb.Mode]))
		}
	}
	if st.LeaseUnits > 0 {
		w = append(w, fmt.Sprintf("this instance holds a lease of %d units on the key: taken from Redis already, admitted here without asking it", st.LeaseUnits))
	}
	if st.DenialCached {
		w = append(w, "this instance caches a denial of the key: the same request is denied without asking Redis until its retry")
	}
	return w
}

func plural(n int, one, many string) string {
	if n == 1 {
		return "1 " + one
	}
	return strconv.Itoa(n) + " " + many
}

// msText writes a time in ms as a Go duration, rounded to the ms.
func msText(ms int64) string { return (time.Duration(ms) * time.Millisecond).String() }
