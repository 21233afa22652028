package config

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/floodgate/floodgate"
	"go.yaml.in/yaml/v3"
)

// This file reads envoyproxy/ratelimit's configuration format: a file
// whose top level has domain: is one domain's descriptor tree.
//
//	domain: api
//	descriptors:
//	  - key: remote_address
//	    rate_limit: {unit: second, requests_per_unit: 10}
//	  - key: path
//	    value: /api/*/orders*       # each * matches any run of characters
//	    rate_limit:
//	      unit: minute
//	      requests_per_unit: 5
//	      algorithm: token-bucket   # floodgate's extension
//	      burst: 10
//
// It is validated as envoyproxy/ratelimit validates it, and more strictly
// where that one is silent (see docs/envoy.md's table of differences).

// Unit is a rate_limit's unit, numbered as the RLS v3 API's
// RateLimitResponse.RateLimit.Unit.
type Unit int32

// The units of envoyproxy/ratelimit, with the RLS API's numbers.
const (
	UnitUnknown Unit = 0
	UnitSecond  Unit = 1
	UnitMinute  Unit = 2
	UnitHour    Unit = 3
	UnitDay     Unit = 4
	UnitMonth   Unit = 5
	UnitYear    Unit = 6
	UnitWeek    Unit = 7
)

var unitNames = map[string]Unit{"second": UnitSecond, "minute": UnitMinute, "hour": UnitHour, "day": UnitDay, "week": UnitWeek, "month": UnitMonth, "year": UnitYear}

// Seconds is the unit's length as envoyproxy/ratelimit counts it: a month
// is 30 days and a year 365.
func (u Unit) Seconds() int64 {
	switch u {
	case UnitSecond:
		return 1
	case UnitMinute:
		return 60
	case UnitHour:
		return 3600
	case UnitDay:
		return 86400
	case UnitWeek:
		return 7 * 86400
	case UnitMonth:
		return 30 * 86400
	case UnitYear:
		return 365 * 86400
	}
	return 0
}

// Domain is one envoyproxy/ratelimit domain: the descriptors of one file.
type Domain struct {
	Name string
	File string
	Line int
	Root Descriptor // its Children are the top-level descriptors
	// HasConcurrency says a descriptor of the domain is a concurrency
	// limit (envoyslots.go).
	HasConcurrency bool
}

// Descriptor is one node of a domain's tree.
type Descriptor struct {
	Key, Value string
	// Path is the node's name as envoyproxy/ratelimit's statistics write
	// it: "domain.key_value.key".
	Path  string
	Limit *EnvoyLimit // nil: no limit at this node
	// Children by "key_value", or "key" for a child without a value;
	// Wildcards lists, in file order, the children whose name holds a *.
	Children       map[string]*Descriptor
	Wildcards      []Wildcard
	ShadowMode     bool
	QuotaMode      bool
	DetailedMetric bool
	ValueToMetric  bool
	ShareThreshold bool
	// Concurrency, floodgate's extension, makes the descriptor a
	// concurrency limit (envoyslots.go); nil for a rate limit.
	Concurrency *Slots
}

// Wildcard is a child whose name ("key_value") holds a *, which matches
// any run of characters, the empty one too: "path_/api/*/v*" matches
// "path_/api/users/v2". A request's entry matches it by its own
// "key_value", as envoyproxy/ratelimit matches it.
type Wildcard struct {
	Name  string
	parts []string // Name split at each *: at least two
}

func newWildcard(name string) Wildcard {
	return Wildcard{Name: name, parts: strings.Split(name, "*")}
}

// Match reports whether name ("key_value") matches the wildcard. The
// leftmost place of each middle part is the right one: a later one only
// leaves less room for the parts after it. Its work is bounded by the
// name's length times the wildcard's parts, both bounded by the request
// and the file.
func (w Wildcard) Match(name string) bool {
	first, last := w.parts[0], w.parts[len(w.parts)-1]
	if len(name) < len(first)+len(last) || !strings.HasPrefix(name, first) || !strings.HasSuffix(name, last) {
		return false
	}
	rest := name[len(first) : len(name)-len(last)]
	for _, part := range w.parts[1 : len(w.parts)-1] {
		i := strings.Index(rest, part)
		if i < 0 {
			return false
		}
		rest = rest[i+len(part):]
	}
	return true
}

// EnvoyLimit is a descriptor's rate_limit.
type EnvoyLimit struct {
	RequestsPerUnit uint32
	Unit            Unit
	Unlimited       bool
	Name            string
	Replaces        []string
	// Limit is the floodgate limit that decides it: by default a fixed
	// window of RequestsPerUnit per Unit, aligned to the Unix epoch as
	// envoyproxy/ratelimit aligns its windows; or what the extension
	// fields (algorithm, burst, unit_multiplier) ask for. Zero when
	// Unlimited, or when RequestsPerUnit is 0 (every hit is over it).
	Limit floodgate.Limit
	// Counting is true for the default fixed window: as in
	// envoyproxy/ratelimit, hits over the limit are counted too.
	Counting bool
}

var (
	envoyRootFields       = []string{"domain", "descriptors"}
	envoyDescriptorFields = []string{"key", "value", "rate_limit", "descriptors", "shadow_mode", "quota_mode", "detailed_metric", "value_to_metric", "share_threshold", "metadata", "concurrency"}
	envoyLimitFields      = []string{"requests_per_unit", "unit", "unlimited", "name", "replaces", "algorithm", "burst", "unit_multiplier"}
)

// isEnvoy reports whether a file's top-level mapping is in
// envoyproxy/ratelimit's format: it has domain:.
func isEnvoy(root *yaml.Node) bool {
	if root.Kind != yaml.MappingNode {
		return false
	}
	for i := 0; i+1 < len(root.Content); i += 2 {
		if root.Content[i].Value == "domain" {
			return true
		}
	}
	return false
}

func (p *parser) envoyDomain(root *yaml.Node) *Domain {
	f := p.fields(root, "", envoyRootFields...)
	d := &Domain{File: p.file, Line: root.Line, Root: Descriptor{Children: map[string]*Descriptor{}}}
	dn := f["domain"]
	if dn.Kind != yaml.ScalarNode || dn.Value == "" {
		p.errorf(dn, "domain", "config file cannot have empty domain")
	} else {
		d.Name = dn.Value
	}
	d.Root.Path = d.Name
	if ds := f["descriptors"]; ds != nil {
		p.descriptors(&d.Root, ds, "descriptors")
	}
	d.HasConcurrency = hasSlots(&d.Root)
	return d
}

func (p *parser) descriptors(parent *Descriptor, list *yaml.Node, path string) {
	if list.Kind != yaml.SequenceNode {
		if !(list.Kind == yaml.ScalarNode && list.Tag == "!!null") {
			p.errorf(list, path, "must be a list of descriptors")
		}
		return
	}
	for i, n := range list.Content {
		dp := fmt.Sprintf("%s[%d]", path, i)
		f := p.fields(n, dp, envoyDescriptorFields...)
		d := &Descriptor{Children: map[string]*Descriptor{}}
		if k := f["key"]; k == nil || k.Value == "" || k.Kind != yaml.ScalarNode {
			at := n
			if k != nil {
				at = k
			}
			p.errorf(at, dp+".key", "descriptor has empty key")
			continue
		} else {
			d.Key = k.Value
		}
		if v := f["value"]; v != nil {
			if v.Kind != yaml.ScalarNode {
				p.errorf(v, dp+".value", "must be a string")
			} else if v.Tag != "!!null" {
				d.Value = v.Value
			}
		}
		name := d.Key
		if d.Value != "" {
			name += "_" + d.Value
		}
		d.Path = parent.Path + "." + name
		if _, dup := parent.Children[name]; dup {
			p.errorf(n, dp, "duplicate descriptor composite key '%s'", d.Path)
			continue
		}
		d.ShadowMode = p.boolean(f["shadow_mode"], dp+".shadow_mode")
		d.QuotaMode = p.boolean(f["quota_mode"], dp+".quota_mode")
		d.DetailedMetric = p.boolean(f["detailed_metric"], dp+".detailed_metric")
		d.ValueToMetric = p.boolean(f["value_to_metric"], dp+".value_to_metric")
		d.ShareThreshold = p.boolean(f["share_threshold"], dp+".share_threshold")
		if d.ShareThreshold && !strings.Contains(name, "*") {
			p.errorf(f["share_threshold"], dp+".share_threshold", "share_threshold can only be used with wildcard values (containing '*'), but found key '%s'", name)
		}
		if md := f["metadata"]; md != nil {
			p.metadata(md, dp+".metadata")
		}
		if rl := f["rate_limit"]; rl != nil {
			d.Limit = p.envoyLimit(rl, dp+".rate_limit")
		}
		if c := f["concurrency"]; c != nil { // floodgate's extension (envoyslots.go)
			if f["rate_limit"] != nil {
				p.errorf(c, dp+".concurrency", "a descriptor is a rate limit or a concurrency limit, not both")
			}
			d.Concurrency = p.envoySlots(c, dp+".concurrency")
		}
		if ds := f["descriptors"]; ds != nil {
			p.descriptors(d, ds, dp+".descriptors")
		}
		parent.Children[name] = d
		if strings.Contains(name, "*") {
			parent.Wildcards = append(parent.Wildcards, newWildcard(name))
		}
	}
}

// metadata checks a descriptor's metadata: a mapping of anything, which
// envoyproxy/ratelimit sends back in the answer's dynamic metadata when
// it is asked to. floodgate sends no dynamic metadata; it accepts the
// field, so that such files load, and ignores it.
func (p *parser) metadata(n *yaml.Node, path string) {
	if n.Kind == yaml.AliasNode {
		n = n.Alias
	}
	switch {
	case n.Kind == yaml.ScalarNode && n.Tag == "!!null":
	case n.Kind != yaml.MappingNode:
		p.errorf(n, path, "must be a mapping")
	default:
		for i := 0; i+1 < len(n.Content); i += 2 {
			if k := n.Content[i]; k.Kind != yaml.ScalarNode {
				p.errorf(k, path, "a key must be a string")
			}
		}
	}
}

func (p *parser) boolean(n *yaml.Node, path string) bool {
	if n == nil {
		return false
	}
	switch n.Value {
	case "true":
		return true
	case "false":
		return false
	}
	p.errorf(n, path, "must be true or false, got %q", n.Value)
	return false
}

func (p *parser) envoyLimit(n *yaml.Node, path string) *EnvoyLimit {
	before := len(p.errs)
	f := p.fields(n, path, envoyLimitFields...)
	l := &EnvoyLimit{Unlimited: p.boolean(f["unlimited"], path+".unlimited")}
	if rpu := f["requests_per_unit"]; rpu != nil {
		if i, ok := p.integer(rpu, path+".requests_per_unit"); ok {
			if i < 0 || i > 1<<32-1 {
				p.errorf(rpu, path+".requests_per_unit", "must be from 0 to %d, got %d", uint32(1<<32-1), i)
			} else {
				l.RequestsPerUnit = uint32(i)
			}
		}
	}
	un := f["unit"]
	if un != nil {
		l.Unit = unitNames[strings.ToLower(un.Value)]
	}
	switch {
	case l.Unlimited && l.Unit != UnitUnknown:
		p.errorf(un, path+".unit", "should not specify rate limit unit when unlimited")
	case !l.Unlimited && l.Unit == UnitUnknown:
		at, v := n, ""
		if un != nil {
			at, v = un, un.Value
		}
		p.errorf(at, path+".unit", "invalid rate limit unit '%s' (one of second, minute, hour, day, week, month, year)", v)
	}
	if nn := f["name"]; nn != nil {
		l.Name = nn.Value
	}
	if rs := f["replaces"]; rs != nil {
		if rs.Kind != yaml.SequenceNode {
			p.errorf(rs, path+".replaces", "must be a list of {name: ...}")
		} else {
			for i, r := range rs.Content {
				rp := fmt.Sprintf("%s.replaces[%d]", path, i)
				rf := p.fields(r, rp, "name")
				name := ""
				if rn := rf["name"]; rn != nil {
					name = rn.Value
				}
				switch {
				case name == "":
					p.errorf(r, rp, "should not have an empty replaces entry")
				case name == l.Name:
					p.errorf(r, rp, "replaces should not contain name of same descriptor")
				default:
					l.Replaces = append(l.Replaces, name)
				}
			}
		}
	}
	if len(p.errs) > before || l.Unlimited {
		for _, k := range []string{"algorithm", "burst", "unit_multiplier"} {
			if v := f[k]; v != nil && l.Unlimited {
				p.errorf(v, path+"."+k, "an unlimited rate_limit takes no %s", k)
			}
		}
		return l
	}
	l.Limit, l.Counting = p.envoyAlgorithm(n, path, f, l)
	return l
}

// envoyAlgorithm builds the floodgate limit of a rate_limit: the counting
// fixed window by default, or floodgate's extension.
func (p *parser) envoyAlgorithm(n *yaml.Node, path string, f map[string]*yaml.Node, l *EnvoyLimit) (floodgate.Limit, bool) {
	mult := int64(1)
	if m := f["unit_multiplier"]; m != nil {
		if i, ok := p.integer(m, path+".unit_multiplier"); ok {
			if i < 1 || time.Duration(i)*time.Duration(l.Unit.Seconds())*time.Second > floodgate.MaxPeriod {
				p.errorf(m, path+".unit_multiplier", "must be from 1 to %d for unit %s, got %d", int64(floodgate.MaxPeriod/time.Second)/l.Unit.Seconds(), strings.ToLower(unitLabel(l.Unit)), i)
				return floodgate.Limit{}, false
			}
			mult = i
		}
	}
	period := time.Duration(mult*l.Unit.Seconds()) * time.Second
	q := int64(l.RequestsPerUnit)
	an := f["algorithm"]
	burst := q
	if b := f["burst"]; b != nil {
		if an == nil {
			p.errorf(b, path+".burst", "burst needs an algorithm (token-bucket, leaky-bucket or gcra)")
			return floodgate.Limit{}, false
		}
		i, ok := p.integer(b, path+".burst")
		if !ok {
			return floodgate.Limit{}, false
		}
		if i < 1 || i > floodgate.MaxQuota {
			p.errorf(b, path+".burst", "must be from 1 to %d, got %d", int64(floodgate.MaxQuota), i)
			return floodgate.Limit{}, false
		}
		burst = i
	}
	if q == 0 {
		if an != nil {
			p.errorf(f["requests_per_unit"], path+".requests_per_unit", "must be at least 1 with an algorithm")
		}
		return floodgate.Limit{}, an == nil // every hit is over the limit
	}
	var lim floodgate.Limit
	counting := false
	if an == nil {
		lim, counting = floodgate.FixedWindow(q, period), true
	} else {
		alg, err := floodgate.ParseAlgorithm(an.Value)
		if err != nil {
			p.errorf(an, path+".algorithm", "unknown algorithm %q (one of token-bucket, leaky-bucket, gcra, fixed-window, sliding-log, sliding-window)", an.Value)
			return floodgate.Limit{}, false
		}
		if f["burst"] != nil && alg != floodgate.AlgorithmTokenBucket && alg != floodgate.AlgorithmLeakyBucket && alg != floodgate.AlgorithmGCRA {
			p.errorf(f["burst"], path+".burst", "is not a parameter of %s", alg)
			return floodgate.Limit{}, false
		}
		switch alg {
		case floodgate.AlgorithmTokenBucket:
			lim = floodgate.TokenBucket(q, period, burst)
		case floodgate.AlgorithmLeakyBucket:
			lim = floodgate.LeakyBucket(burst, q, period)
		case floodgate.AlgorithmGCRA:
			lim = floodgate.GCRA(burst-1, q, period)
		case floodgate.AlgorithmFixedWindow:
			lim = floodgate.FixedWindow(q, period)
		case floodgate.AlgorithmSlidingLog:
			if q > floodgate.MaxLogQuota {
				p.errorf(f["requests_per_unit"], path+".requests_per_unit", "must be at most %d with sliding-log, got %d: %s", floodgate.MaxLogQuota, q, logAdvice)
				return floodgate.Limit{}, false
			}
			lim = floodgate.SlidingLog(q, period)
		case floodgate.AlgorithmSlidingWindow:
			lim = floodgate.SlidingWindow(q, period)
		}
	}
	if err := lim.Validate(); err != nil {
		p.errorf(n, path, "%s", strings.TrimPrefix(err.Error(), floodgate.ErrInvalidLimit.Error()+": "))
		return floodgate.Limit{}, false
	}
	return lim, counting
}

func unitLabel(u Unit) string {
	for name, v := range unitNames {
		if v == u {
			return strings.ToUpper(name)
		}
	}
	return "UNKNOWN"
}

// String is the unit as the RLS API's enum names it: "MINUTE".
func (u Unit) String() string { return unitLabel(u) }

// Match is what a request's descriptor resolves to in a domain: the
// limit that applies, if any, and how to name its counter and statistics.
type Match struct {
	Limit *EnvoyLimit
	Node  *Descriptor
	// Shared holds, per entry, the wildcard that replaces the entry's
	// value in the counter's key ("" for the value itself): entries
	// matched by a share_threshold wildcard share one counter.
	Shared []string
	// StatKey is the name of the limit's statistics, as
	// envoyproxy/ratelimit writes it: "domain.key_value.key".
	StatKey string
}

// Entry is one key and value of a request's descriptor.
type Entry struct{ Key, Value string }

// Lookup finds the limit that applies to a request's descriptor, as
// envoyproxy/ratelimit does: each entry matches a child by key and value,
// then by a wildcard (a value with *), then by key alone; the limit
// applies when it is on the node of the descriptor's last entry.
func (d *Domain) Lookup(entries []Entry) Match {
	var m Match
	node := &d.Root
	// What each entry matched: the node, the wildcard it matched by (or
	// ""), whether it matched by its value. The statistics' names are made
	// from them only when they differ from the node's own Path.
	type step struct {
		next     *Descriptor
		wildcard string
		byValue  bool
	}
	var buf [8]step
	steps := buf[:0]
	renamed := false // value_to_metric puts a request value in the name
	for i, e := range entries {
		name := e.Key + "_" + e.Value
		next := node.Children[name]
		wildcard := ""
		if next == nil {
			for _, w := range node.Wildcards {
				if w.Match(name) {
					next, wildcard = node.Children[w.Name], w.Name
					break
				}
			}
		}
		byValue := next != nil
		if next == nil {
			next = node.Children[e.Key]
		}
		steps = append(steps, step{next, wildcard, byValue})
		if next != nil {
			if wildcard != "" && next.ShareThreshold {
				if m.Shared == nil {
					m.Shared = make([]string, len(entries))
				}
				m.Shared[i] = strings.TrimPrefix(wildcard, e.Key+"_")
			} else if next.ValueToMetric && (wildcard != "" || !byValue) {
				renamed = true
			}
		}
		if next != nil && next.Limit != nil && i == len(entries)-1 {
			m.Limit, m.Node, m.StatKey = next.Limit, next, next.Path
		}
		if next == nil || len(next.Children) == 0 {
			break
		}
		node = next
	}
	if m.Limit == nil {
		return Match{}
	}
	switch {
	case m.Node.DetailedMetric:
		var b strings.Builder
		b.WriteString(d.Name)
		for i, e := range entries {
			b.WriteString("." + e.Key)
			if m.Shared != nil && m.Shared[i] != "" {
				b.WriteString("_" + m.Shared[i])
			} else if e.Value != "" || m.Shared == nil {
				b.WriteString("_" + e.Value)
			}
		}
		m.StatKey = b.String()
	case renamed:
		var b strings.Builder
		b.WriteString(d.Name)
		for i, st := range steps {
			e := entries[i]
			v := ""
			switch {
			case st.wildcard != "" && st.next.ShareThreshold:
				v = m.Shared[i]
			case st.wildcard != "" && st.next.ValueToMetric:
				v = e.Value
			case st.wildcard != "":
				v = strings.TrimPrefix(st.wildcard, e.Key+"_")
			case st.byValue, st.next.ValueToMetric:
				v = e.Value
			}
			b.WriteString("." + e.Key)
			if v != "" {
				b.WriteString("_" + v)
			}
		}
		m.StatKey = b.String()
	}
	return m
}

// addDomain adds d, or reports a domain given twice among files.
func (c *Config) addDomain(d *Domain, merge bool) error {
	if prev, dup := c.Domains[d.Name]; dup {
		if merge {
			return prev.merge(d)
		}
		return &Error{File: d.File, Line: d.Line, Column: 1, Field: "domain", Msg: fmt.Sprintf("duplicate domain '%s' in config file (also in %s)", d.Name, prev.File)}
	}
	if c.Domains == nil {
		c.Domains = map[string]*Domain{}
	}
	c.Domains[d.Name] = d
	return nil
}

// merge adds the top-level descriptors of d, the same domain in another
// file, to dom's, as envoyproxy/ratelimit's MERGE_DOMAIN_CONFIG patches a
// domain: wildcards after dom's, in d's order. A top-level descriptor
// that both have is an error, with d's file.
func (dom *Domain) merge(d *Domain) error {
	for _, name := range slices.Sorted(maps.Keys(d.Root.Children)) { // the same error every time
		if _, dup := dom.Root.Children[name]; dup {
			return &Error{File: d.File, Line: d.Line, Column: 1, Field: "descriptors", Msg: fmt.Sprintf("duplicate descriptor composite key '%s' (also in %s)", d.Root.Children[name].Path, dom.File)}
		}
	}
	for name, child := range d.Root.Children {
		dom.Root.Children[name] = child
	}
	dom.Root.Wildcards = append(dom.Root.Wildcards, d.Root.Wildcards...)
	dom.HasConcurrency = dom.HasConcurrency || d.HasConcurrency
	return nil
}
