package service

import (
	"context"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/floodgate/floodgate"
	"github.com/floodgate/floodgate/internal/server/config"
)

// Override is a key's own limits under a rule (see
// floodgate.Limiter.SetOverride). It is kept in the store, so every
// instance that shares the store applies it, and it outlives reloads of
// the rules.
type Override struct {
	Rule, Key string
	Limits    []floodgate.Limit
	// TTL is the time it has left; 0 for ever.
	TTL time.Duration
}

// lookup returns the rule called rule, checking key.
func (s *Service) lookup(rule, key string) (*rule, error) {
	r, ok := s.rules.Load().rules[rule]
	if !ok {
		return nil, fmt.Errorf("%w %q", ErrUnknownRule, rule)
	}
	if err := checkKey(key); err != nil {
		return nil, err
	}
	return r, nil
}

// SetOverride gives key, under rule, the limits of o in place of the
// rule's, carrying its usage over as o.Strategy says.
func (s *Service) SetOverride(ctx context.Context, rule, key string, o config.Override) error {
	r, err := s.lookup(rule, key)
	if err != nil {
		return err
	}
	return r.lim.SetOverride(ctx, r.prefix+key, floodgate.Override{Limits: o.Limits, TTL: o.TTL}, o.Strategy)
}

// DeleteOverride gives key, under rule, the rule's limits again.
func (s *Service) DeleteOverride(ctx context.Context, rule, key string, st floodgate.Strategy) error {
	r, err := s.lookup(rule, key)
	if err != nil {
		return err
	}
	return r.lim.DeleteOverride(ctx, r.prefix+key, st)
}

// GetOverride returns key's override under rule, and false when it has
// none.
func (s *Service) GetOverride(ctx context.Context, rule, key string) (Override, bool, error) {
	r, err := s.lookup(rule, key)
	if err != nil {
		return Override{}, false, err
	}
	o, ok, err := r.lim.GetOverride(ctx, r.prefix+key)
	if !ok || err != nil {
		return Override{}, false, err
	}
	return Override{Rule: rule, Key: key, Limits: o.Limits, TTL: o.TTL}, true, nil
}

// MaxListed is the most overrides that ListOverrides returns.
const MaxListed = 10000

// ListOverrides returns the overrides of rule's keys, or of every rule's
// when rule is "", sorted by rule and key, at most MaxListed of them; more
// reports whether there were others.
func (s *Service) ListOverrides(ctx context.Context, rule string) (list []Override, more bool, err error) {
	rs := s.rules.Load()
	var lim *floodgate.Limiter
	if rule != "" {
		r, ok := rs.rules[rule]
		if !ok {
			return nil, false, fmt.Errorf("%w %q", ErrUnknownRule, rule)
		}
		lim = r.lim
	} else {
		for _, r := range rs.rules {
			lim = r.lim
			break
		}
	}
	if lim == nil {
		return nil, false, nil // no rules: no rule keys
	}
	err = lim.ListOverrides(ctx, func(storeKey string, o floodgate.Override) bool {
		name, key, ok := splitRuleKey(storeKey)
		if !ok || (rule != "" && name != rule) {
			return true
		}
		if len(list) == MaxListed {
			more = true
			return false
		}
		list = append(list, Override{Rule: name, Key: key, Limits: o.Limits, TTL: o.TTL})
		return true
	})
	sort.Slice(list, func(i, j int) bool {
		if list[i].Rule != list[j].Rule {
			return list[i].Rule < list[j].Rule
		}
		return list[i].Key < list[j].Key
	})
	return list, more, err
}

// splitRuleKey is ruleKey's inverse.
func splitRuleKey(storeKey string) (rule, key string, ok bool) {
	rest, ok := strings.CutPrefix(storeKey, "r")
	if !ok {
		return "", "", false
	}
	n, rest, ok := strings.Cut(rest, ":")
	size, err := strconv.Atoi(n)
	if !ok || err != nil || size < 1 || size >= len(rest) || rest[size] != ':' {
		return "", "", false
	}
	return rest[:size], rest[size+1:], true
}
