package config

import (
	"fmt"
	"slices"
	"time"

	"github.com/floodgate/floodgate"
	"go.yaml.in/yaml/v3"
)

// Slots is a concurrency rule: at most Slots requests per key in flight
// at once, each holding its slot until released, or for Lease when it is
// neither released nor extended. With Rules, acquiring also decides those
// rate rules on the same key, all or nothing (floodgate.AcquireGroup).
//
//	concurrency:
//	  - name: exports
//	    slots: 50
//	    lease: 5m
//	    rules: [api]        # optional
type Slots struct {
	Name  string
	Slots int64
	Lease time.Duration
	Rules []string
}

// ConcurrencyRule returns the concurrency rule called name.
func (c *Config) ConcurrencyRule(name string) (Slots, bool) {
	for _, s := range c.Concurrency {
		if s.Name == name {
			return s, true
		}
	}
	return Slots{}, false
}

// concurrency parses the concurrency list n into c, after the rules.
func (p *parser) concurrency(c *Config, n *yaml.Node) {
	if n.Kind != yaml.SequenceNode || len(n.Content) == 0 || len(n.Content) > MaxRules {
		p.errorf(n, "concurrency", "must be a list of 1 to %d concurrency rules", MaxRules)
		return
	}
	seen := map[string]bool{}
	for i, sn := range n.Content {
		path := fmt.Sprintf("concurrency[%d]", i)
		f := p.fields(sn, path, "name", "slots", "lease", "rules")
		var s Slots
		switch name := f["name"]; {
		case name == nil:
			p.errorf(sn, path+".name", "missing")
		case !namePattern.MatchString(name.Value) || name.Kind != yaml.ScalarNode:
			p.errorf(name, path+".name", "must be 1 to 64 letters, digits or _ . : -, got %q", name.Value)
		case seen[name.Value]:
			p.errorf(name, path+".name", "%q names another concurrency rule too", name.Value)
		default:
			s.Name = name.Value
			seen[s.Name] = true
		}
		p.slotsAndLease(&s, sn, f, path, "its holder neither releases nor extends it")
		if rs := f["rules"]; rs != nil {
			if rs.Kind != yaml.SequenceNode || len(rs.Content) > floodgate.MaxLimits {
				p.errorf(rs, path+".rules", "must be a list of at most %d rate rules", floodgate.MaxLimits)
			} else {
				for j, r := range rs.Content {
					if _, ok := c.Rule(r.Value); !ok || r.Kind != yaml.ScalarNode {
						p.errorf(r, fmt.Sprintf("%s.rules[%d]", path, j), "%q is not a rule of this file", r.Value)
						continue
					}
					if slices.Contains(s.Rules, r.Value) {
						// Each acquire would charge it twice.
						p.errorf(r, fmt.Sprintf("%s.rules[%d]", path, j), "%q is listed twice", r.Value)
						continue
					}
					s.Rules = append(s.Rules, r.Value)
				}
			}
		}
		c.Concurrency = append(c.Concurrency, s)
	}
}

// slotsAndLease reads the slots and lease fields f of n, a concurrency
// rule's or a descriptor's, into s; leaseWhy says when a lease ends a
// permit, in the error for a missing lease.
func (p *parser) slotsAndLease(s *Slots, n *yaml.Node, f map[string]*yaml.Node, path, leaseWhy string) {
	if v := f["slots"]; v == nil {
		p.errorf(n, path+".slots", "missing: the most requests per key in flight at once")
	} else if i, ok := p.integer(v, path+".slots"); ok {
		if i < 1 || i > floodgate.MaxSlots {
			p.errorf(v, path+".slots", "must be from 1 to %d, got %d", floodgate.MaxSlots, i)
		}
		s.Slots = i
	}
	if v := f["lease"]; v == nil {
		p.errorf(n, path+".lease", "missing: how long a slot is held when %s", leaseWhy)
	} else if s.Lease = p.duration(v, path+".lease"); s.Lease <= 0 || s.Lease > floodgate.MaxPeriod || s.Lease%time.Microsecond != 0 {
		p.errorf(v, path+".lease", "must be a positive whole number of microseconds up to %s, got %q", floodgate.MaxPeriod, v.Value)
	}
}
