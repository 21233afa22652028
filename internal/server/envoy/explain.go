package envoy

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/floodgate/floodgate"
	"github.com/floodgate/floodgate/internal/lib/httpjson"
	"github.com/floodgate/floodgate/internal/server/config"
	"github.com/floodgate/floodgate/internal/server/service"
)

// This file explains Envoy's decisions: for a RateLimitRequest, which
// descriptor of the domain each of its descriptors matched and why, the
// limit in force and its state, and the answer ShouldRateLimit would give
// now, charging nothing (POST /v1/explain/envoy).

// MaxExplainDescriptors is the most descriptors of one request to
// explain: each is inspected on its own, one store call each.
const MaxExplainDescriptors = 64

// Explanation says how ShouldRateLimit would answer an Envoy request now,
// and why.
type Explanation struct {
	Domain string `json:"domain"`
	// DomainKnown is false when the configuration has no such domain:
	// then no limit applies, as in envoyproxy/ratelimit.
	DomainKnown bool `json:"domain_known"`
	// OverallCode is the answer's overall code now: "OK" or
	// "OVER_LIMIT".
	OverallCode string `json:"overall_code"`
	// Descriptors explains each descriptor of the request, in order.
	Descriptors []DescriptorExplanation `json:"descriptors"`
	// Why is the explanation in sentences, for people.
	Why []string `json:"why"`
}

// DescriptorExplanation explains one descriptor of a request.
type DescriptorExplanation struct {
	Entries []ExplainEntry `json:"entries"`
	// Match is the walk down the domain's descriptors, one step per entry
	// it reached.
	Match []ExplainStep `json:"match,omitempty"`
	// Descriptor is the configured descriptor whose limit applies, as the
	// statistics name it; "" when none does.
	Descriptor string             `json:"descriptor,omitempty"`
	Limit      *ExplainEnvoyLimit `json:"limit,omitempty"`
	ShadowMode bool               `json:"shadow_mode,omitempty"`
	QuotaMode  bool               `json:"quota_mode,omitempty"`
	// SharedKey reports that a share_threshold wildcard makes every value
	// it matches share one counter.
	SharedKey bool `json:"shared_key,omitempty"`
	// ReplacedBy lists the descriptors of the request (their indexes)
	// whose limit replaces this one's: then it does not apply.
	ReplacedBy []int `json:"replaced_by,omitempty"`
	// Concurrency is set when the descriptor is a concurrency limit
	// (floodgate's extension): its slots on the key now. Limit and State
	// are then unset.
	Concurrency *ExplainSlots `json:"concurrency,omitempty"`
	// Hits is what the request would charge it.
	Hits int64 `json:"hits"`
	// State is the limit's state now, in Envoy's terms: a counting
	// window's quota is requests_per_unit.
	State *service.ExplainLimit `json:"state,omitempty"`
	// Store says what answers for its counter.
	Store *service.ExplainStore `json:"store,omitempty"`
	// Code is its status's code now: "OK" or "OVER_LIMIT".
	Code string   `json:"code"`
	Why  []string `json:"why"`
}

// ExplainEntry is one entry of a descriptor.
type ExplainEntry struct {
	Key   string `json:"key"`
	Value string `json:"value"`
}

// ExplainStep is what one entry matched.
type ExplainStep struct {
	Key   string `json:"key"`
	Value string `json:"value"`
	// Matched is "value" (key and value), "wildcard", "key" (the key,
	// any value) or "none".
	Matched string `json:"matched"`
	// Wildcard is the wildcard it matched by, "key_value*".
	Wildcard string `json:"wildcard,omitempty"`
	// Descriptor is the configured descriptor it matched.
	Descriptor string `json:"descriptor,omitempty"`
	// HasLimit reports that that descriptor has a rate_limit.
	HasLimit bool `json:"has_limit,omitempty"`
}

// ExplainEnvoyLimit is the rate_limit in force for a descriptor.
type ExplainEnvoyLimit struct {
	// From is "config", or "request" for a limit the descriptor carries.
	From            string   `json:"from"`
	Name            string   `json:"name,omitempty"`
	RequestsPerUnit uint32   `json:"requests_per_unit"`
	Unit            string   `json:"unit,omitempty"`
	Unlimited       bool     `json:"unlimited,omitempty"`
	Replaces        []string `json:"replaces,omitempty"`
	// Summary is the floodgate limit that decides it; "" when unlimited
	// or requests_per_unit is 0.
	Summary string `json:"summary,omitempty"`
	// Counting is envoyproxy/ratelimit's window, which counts hits over
	// the limit too.
	Counting bool `json:"counting,omitempty"`
}

// explained is a descriptor on its way to its explanation.
type explained struct {
	limit       *config.EnvoyLimit
	lim         *floodgate.Limiter
	key         string
	fromRequest bool // the descriptor carried the limit
}

// Explain tells how ShouldRateLimit would answer req now, and why, for
// each descriptor: what it matched, the limit in force, its state, and
// what answers for it. It charges nothing and counts nothing. Each
// descriptor is explained on its counter's state now: two descriptors of
// one request on one counter are decided one after the other, the second
// seeing the first's hits, which the explanation of the second leaves
// out. Its errors
// wrap service.ErrBadRequest as ShouldRateLimit's do (and for more than
// MaxExplainDescriptors descriptors), or are the store's.
func (s *Service) Explain(ctx context.Context, req *rlsv3.RateLimitRequest) (Explanation, error) {
	if req.GetDomain() == "" {
		return Explanation{}, fmt.Errorf("%w: rate limit domain must not be empty", service.ErrBadRequest)
	}
	if len(req.GetDescriptors()) == 0 {
		return Explanation{}, fmt.Errorf("%w: rate limit descriptor list must not be empty", service.ErrBadRequest)
	}
	if n := len(req.Descriptors); n > MaxExplainDescriptors {
		return Explanation{}, fmt.Errorf("%w: rate limit descriptor list holds %d descriptors, more than the %d an explanation takes", service.ErrBadRequest, n, MaxExplainDescriptors)
	}
	doms, _ := s.svc.Prepared().(domains)
	dom := doms[req.Domain]
	e := Explanation{Domain: req.Domain, DomainKnown: dom != nil, OverallCode: "OK", Descriptors: make([]DescriptorExplanation, len(req.Descriptors))}
	xs := make([]explained, len(req.Descriptors))
	replacers := map[string][]int{} // a limit's name: the descriptors that replace it
	for i, d := range req.Descriptors {
		de := &e.Descriptors[i]
		de.Hits = hitsAddend(req, d)
		for _, en := range d.GetEntries() {
			de.Entries = append(de.Entries, ExplainEntry{Key: en.GetKey(), Value: en.GetValue()})
		}
		if dom == nil {
			de.Why = append(de.Why, fmt.Sprintf("no domain %q is configured: no limit applies", req.Domain))
			continue
		}
		x := &xs[i]
		if ov := d.GetLimit(); ov != nil {
			l, lim, err := s.overrides.get(s.store, s.envoyLimit, ov)
			if err != nil {
				return Explanation{}, err
			}
			x.limit, x.lim, x.key, x.fromRequest = l, lim, envoyKey(req.Domain, d.GetEntries(), nil), true
			de.Why = append(de.Why, fmt.Sprintf("the descriptor carries its own limit, %d per %s: it applies in place of the domain's", l.RequestsPerUnit, strings.ToLower(l.Unit.String())))
			continue
		}
		if dom.cfg.HasConcurrency {
			if done, err := s.explainSlots(ctx, req.Domain, dom, d, de); err != nil {
				return Explanation{}, err
			} else if done {
				if de.Code == "OVER_LIMIT" {
					e.OverallCode = "OVER_LIMIT"
				}
				continue
			}
		}
		steps, m := dom.cfg.Trace(entries(d.GetEntries()))
		de.Match, de.Why = explainSteps(steps, len(de.Entries), m)
		if m.Limit == nil {
			continue
		}
		de.Descriptor = m.StatKey
		de.ShadowMode, de.QuotaMode, de.SharedKey = m.Node.ShadowMode, m.Node.QuotaMode, m.Shared != nil
		if de.SharedKey {
			de.Why = append(de.Why, "share_threshold: every value its wildcard matches draws on one counter")
		}
		x.limit, x.lim = m.Limit, dom.lims[m.Limit]
		x.key = envoyKey(req.Domain, d.GetEntries(), m.Shared)
		for _, r := range m.Limit.Replaces {
			replacers[r] = append(replacers[r], i)
		}
	}
	quotas, quotasOver := 0, 0
	for i := range xs {
		x, de := &xs[i], &e.Descriptors[i]
		if de.Concurrency != nil {
			continue
		}
		if x.limit == nil {
			de.Code = "OK"
			continue
		}
		de.Limit = explainEnvoyLimit(x.limit, x.fromRequest)
		if by := replacers[x.limit.Name]; x.limit.Name != "" && len(by) > 0 && !x.limit.Unlimited {
			de.ReplacedBy, de.Code = by, "OK"
			de.Why = append(de.Why, fmt.Sprintf("its limit %q is replaced by the limit of descriptor %s of the request (replaces): it does not apply", x.limit.Name, joinInts(by)))
			continue
		}
		if x.limit.Unlimited {
			de.Code = "OK"
			de.Why = append(de.Why, "its rate_limit is unlimited: it is never over the limit")
			continue
		}
		over, err := s.explainState(ctx, x, de)
		if err != nil {
			return Explanation{}, err
		}
		de.Code = "OK"
		if de.QuotaMode {
			quotas++
		}
		switch {
		case over && de.ShadowMode:
			de.Why = append(de.Why, "shadow_mode: it is over the limit, which is counted but never denies")
		case over && de.QuotaMode:
			de.Code = "OVER_LIMIT"
			quotasOver++
			de.Why = append(de.Why, "quota_mode: it is over the limit; the request is over only when every quota_mode descriptor is")
		case over:
			de.Code, e.OverallCode = "OVER_LIMIT", "OVER_LIMIT"
		case de.ShadowMode:
			de.Why = append(de.Why, "shadow_mode: it would never deny")
		}
	}
	if quotas > 0 && quotasOver == quotas {
		e.OverallCode = "OVER_LIMIT"
	}
	e.Why = overallWhy(&e)
	return e, nil
}

// explainState inspects x's counter and fills de's State and Store; it
// reports whether the request's hits would be over the limit now, as
// decided would find.
func (s *Service) explainState(ctx context.Context, x *explained, de *DescriptorExplanation) (bool, error) {
	rpu := int64(x.limit.RequestsPerUnit)
	if x.lim == nil { // requests_per_unit: 0
		de.Why = append(de.Why, "its requests_per_unit is 0: every hit is over the limit")
		return true, nil
	}
	in, err := x.lim.Inspect(ctx, x.key)
	if err != nil {
		s.svc.KeyFailed("envoy", err)
		return false, err
	}
	st := s.svc.ExplainStore(&in)
	de.Store = &st
	ls := service.ExplainLimits(in.Limits, in.Results, "config")
	if in.Overridden {
		ls = service.ExplainLimits(in.Limits, in.Results, "override")
	}
	state := ls[in.Index]
	state.Decides = true
	var over bool
	counting := x.limit.Counting && !s.atomic
	if counting {
		// Its limiter's quota is one more than the limit (envoyLimit):
		// what is left of the limit is one less.
		state.Quota, state.Remaining, state.Summary = rpu, max(state.Remaining-1, 0), x.limit.Limit.String()
		var retry int64
		if state.Remaining < 1 {
			retry = state.ResetAfterMs
		}
		state.RetryAfterMs = &retry
		over = state.Remaining < de.Hits || (de.Hits == 0 && in.Remaining == 0)
	} else {
		over = de.Hits > state.Quota || state.Remaining < de.Hits
	}
	de.State = &state
	full := "full"
	if state.ResetAfterMs > 0 {
		full = "full again in " + (time.Duration(state.ResetAfterMs) * time.Millisecond).String()
	}
	de.Why = append(de.Why, fmt.Sprintf("its counter has %d of %d left, %s; the request's %d %s %s", state.Remaining, state.Quota, full,
		de.Hits, plural(de.Hits, "hit", "hits"), map[bool]string{true: "would be over the limit", false: "would fit"}[over]))
	if counting {
		de.Why = append(de.Why, "it is envoyproxy/ratelimit's fixed window: hits over the limit are counted too")
	}
	return over, nil
}

// explainSteps describes Lookup's walk: its steps, and why a limit
// applies or none does.
func explainSteps(steps []config.Step, n int, m config.Match) ([]ExplainStep, []string) {
	out := make([]ExplainStep, len(steps))
	var why []string
	for i, st := range steps {
		es := ExplainStep{Key: st.Entry.Key, Value: st.Entry.Value, Matched: "none", Wildcard: st.Wildcard}
		if st.Node != nil {
			es.Matched, es.Descriptor, es.HasLimit = st.By, st.Node.Path, st.Node.Limit != nil
		}
		out[i] = es
		switch es.Matched {
		case "value":
			why = append(why, fmt.Sprintf("entry %d (%s=%s) matched descriptor %s by key and value", i, es.Key, es.Value, es.Descriptor))
		case "wildcard":
			why = append(why, fmt.Sprintf("entry %d (%s=%s) matched descriptor %s by the wildcard value %q", i, es.Key, es.Value, es.Descriptor, strings.TrimPrefix(es.Wildcard, es.Key+"_")))
		case "key":
			why = append(why, fmt.Sprintf("entry %d (%s=%s) matched descriptor %s by its key, which takes any value", i, es.Key, es.Value, es.Descriptor))
		default:
			why = append(why, fmt.Sprintf("entry %d (%s=%s) matched no descriptor at its level: no limit applies", i, es.Key, es.Value))
		}
	}
	switch last := len(steps) - 1; {
	case m.Limit != nil || last < 0 || steps[last].Node == nil:
	case last < n-1:
		why = append(why, fmt.Sprintf("descriptor %s has no descriptors below it for entry %d: a limit applies only to a descriptor's last entry, so none does", steps[last].Node.Path, last+1))
	default:
		why = append(why, fmt.Sprintf("descriptor %s has no rate_limit of its own (its limits are deeper): none applies", steps[last].Node.Path))
	}
	return out, why
}

func explainEnvoyLimit(l *config.EnvoyLimit, fromRequest bool) *ExplainEnvoyLimit {
	out := &ExplainEnvoyLimit{From: "config", Name: l.Name, RequestsPerUnit: l.RequestsPerUnit, Unlimited: l.Unlimited, Replaces: l.Replaces, Counting: l.Counting}
	if fromRequest {
		out.From = "request"
	}
	if !l.Unlimited {
		out.Unit = strings.ToLower(l.Unit.String())
	}
	if l.Limit != (floodgate.Limit{}) {
		out.Summary = l.Limit.String()
	}
	return out
}

// overallWhy writes the explanation's own sentences.
func overallWhy(e *Explanation) []string {
	if !e.DomainKnown {
		return []string{fmt.Sprintf("no domain %q is configured: the request is OK, no limit applies", e.Domain)}
	}
	var over, limited []string
	for i, d := range e.Descriptors {
		if d.Code == "OVER_LIMIT" {
			over = append(over, strconv.Itoa(i))
		}
		if d.State != nil || d.Concurrency != nil || (d.Limit != nil && d.ReplacedBy == nil && !d.Limit.Unlimited) {
			limited = append(limited, strconv.Itoa(i))
		}
	}
	w := []string{fmt.Sprintf("domain %q: %d of %d descriptors have a limit in force", e.Domain, len(limited), len(e.Descriptors))}
	if e.OverallCode == "OVER_LIMIT" {
		w = append(w, fmt.Sprintf("the request would be OVER_LIMIT now: descriptor %s %s over its limit", strings.Join(over, ", "), map[bool]string{true: "is", false: "are"}[len(over) == 1]))
	} else {
		w = append(w, "the request would be OK now")
	}
	return w
}

func joinInts(v []int) string {
	s := make([]string, len(v))
	for i, n := range v {
		s[i] = strconv.Itoa(n)
	}
	return strings.Join(s, ", ")
}

func plural(n int64, one, many string) string {
	if n == 1 {
		return one
	}
	return many
}

// ExplainHandler serves POST /v1/explain/envoy: a RateLimitRequest in
// protobuf's JSON mapping, as POST /json takes it, answered with its
// Explanation in JSON. A malformed body, an empty domain, no descriptors
// or too many get 400; a failing store 503, logged to log (default:
// slog.Default()). Its route, method and token are the HTTP API's
// (httpapi.Options.EnvoyExplain).
func (s *Service) ExplainHandler(log *slog.Logger) http.Handler {
	if log == nil {
		log = slog.Default()
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		req, ok := readRequest(w, r)
		if !ok {
			return
		}
		e, err := s.Explain(r.Context(), req)
		switch {
		case errors.Is(err, service.ErrBadRequest):
			httpjson.Problem(w, http.StatusBadRequest, err.Error())
			return
		case errors.Is(err, errors.ErrUnsupported):
			httpjson.Problem(w, http.StatusNotImplemented, err.Error())
			return
		case err != nil:
			log.ErrorContext(r.Context(), "floodgate: explaining an Envoy request failed", "error", err.Error())
			httpjson.Problem(w, http.StatusServiceUnavailable, err.Error())
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Cache-Control", "no-store")
		json.NewEncoder(w).Encode(e)
	})
}
