// Package config reads the rules file of floodgate serve: a YAML file of
// named rules, each one or several limits, validated as a whole, with
// errors that name the file, line and field.
//
//	rules:
//	  - name: api
//	    algorithm: token-bucket
//	    rate: 100
//	    period: 1m
//	    burst: 200
//	  - name: login
//	    algorithm: sliding-window
//	    limit: 5
//	    window: 1m
//	    shadow: true          # count what would be denied, deny nothing
//	    on_change: proportional # on reload, keep the share of the limit used
//	  - name: tiered
//	    limits:               # several limits on one key, checked as one
//	      - {algorithm: gcra, max_burst: 9, count: 10, period: 1s}
//	      - {algorithm: fixed-window, limit: 10000, calendar: day, timezone: Europe/Paris}
//
// It reads envoyproxy/ratelimit's domain files too (envoy.go), alone or
// in a directory with the rules, as one parser; package envoy maps their
// limits to floodgate's and decides Envoy's requests over them.
package config

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/floodgate/floodgate"
	"go.yaml.in/yaml/v3"
)

// Rule is a named set of limits.
type Rule struct {
	Name   string
	Limits []floodgate.Limit
	// Shadow rules are decided and counted but never deny.
	Shadow bool
	// OnChange is what a key keeps of what it used when a reload changes
	// the rule's limits (field on_change; default additive).
	OnChange floodgate.Strategy
}

// Config is a validated rules file, or directory of files. It is
// immutable once Parse or Load returns it.
type Config struct {
	Rules  []Rule
	byName map[string]int
	Source string // the file or directory it came from, or "built-in"
	// Domains are the envoyproxy/ratelimit domains, by name (see
	// envoy.go).
	Domains map[string]*Domain
	// Concurrency are the concurrency rules (concurrency.go).
	Concurrency []Slots
}

// Rule returns the rule called name.
func (c *Config) Rule(name string) (Rule, bool) {
	i, ok := c.byName[name]
	if !ok {
		return Rule{}, false
	}
	return c.Rules[i], true
}

// MaxRules bounds the number of rules in one file.
const MaxRules = 10000

// Example is the rule that floodgate serve uses without a rules file.
func Example() *Config {
	c, err := Parse("built-in", []byte(ExampleYAML))
	if err != nil {
		panic("the built-in config is invalid: " + err.Error()) // a bug, caught by the tests
	}
	return c
}

// ExampleYAML is the built-in rules file: one rule, "example", of 10
// requests per second with bursts of 20.
const ExampleYAML = `rules:
  - name: example
    algorithm: token-bucket
    rate: 10
    period: 1s
    burst: 20
`

// Load reads and parses the file at path, or every *.yaml and *.yml file
// in the directory at path and the directories below it, in path order,
// as envoyproxy/ratelimit loads its runtime directory: each file is either
// a floodgate rules file or one envoyproxy/ratelimit domain. Rule names
// and domains must be unique across the files. Dot files and dot
// directories (Kubernetes' ..data of a mounted ConfigMap, say) are
// skipped.
func Load(path string) (*Config, error) { return LoadWith(path, LoadOptions{}) }

// LoadOptions are the choices of LoadWith; the zero value is Load's.
type LoadOptions struct {
	// MergeDomains lets several files of a directory name one domain, as
	// envoyproxy/ratelimit's MERGE_DOMAIN_CONFIG does: each file's
	// top-level descriptors join the domain's, and a top-level key and
	// value that two of them both have is an error. Without it, a domain
	// in two files is an error.
	MergeDomains bool
}

// LoadWith is Load with options.
func LoadWith(path string, o LoadOptions) (*Config, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return nil, err
	}
	if !fi.IsDir() {
		b, err := os.ReadFile(path)
		if err != nil {
			return nil, err
		}
		return Parse(path, b)
	}
	files, err := Files(path)
	if err != nil {
		return nil, err
	}
	if len(files) == 0 {
		return nil, Errors{{File: path, Msg: "the directory has no *.yaml or *.yml file"}}
	}
	all := &Config{byName: map[string]int{}, Source: path}
	var errs Errors
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			return nil, err
		}
		c, err := Parse(f, b)
		var es Errors
		if errors.As(err, &es) {
			errs = append(errs, es...)
			continue
		} else if err != nil {
			return nil, err
		}
		for _, r := range c.Rules {
			if _, dup := all.byName[r.Name]; dup {
				errs = append(errs, &Error{File: f, Field: "rules", Msg: fmt.Sprintf("rule %q is defined in another file of %s too", r.Name, path)})
				continue
			}
			all.byName[r.Name] = len(all.Rules)
			all.Rules = append(all.Rules, r)
		}
		for _, sl := range c.Concurrency {
			if _, dup := all.ConcurrencyRule(sl.Name); dup {
				errs = append(errs, &Error{File: f, Field: "concurrency", Msg: fmt.Sprintf("concurrency rule %q is defined in another file of %s too", sl.Name, path)})
				continue
			}
			all.Concurrency = append(all.Concurrency, sl)
		}
		for _, d := range c.Domains {
			if err := all.addDomain(d, o.MergeDomains); err != nil {
				errs = append(errs, err.(*Error))
			}
		}
	}
	if len(errs) > 0 {
		return nil, errs
	}
	return all, nil
}

// Files lists the configuration files that Load reads from the directory
// dir and those below it, in path order. Symbolic links to files are
// followed, as Kubernetes mounts a ConfigMap's files; links to
// directories are not, as envoyproxy/ratelimit's loader does not.
func Files(dir string) ([]string, error) {
	var files []string
	err := filepath.WalkDir(dir, func(path string, e fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		n := e.Name()
		if path == dir {
			return nil
		}
		if strings.HasPrefix(n, ".") {
			if e.IsDir() {
				return filepath.SkipDir
			}
			return nil
		}
		if !e.IsDir() && (strings.HasSuffix(n, ".yaml") || strings.HasSuffix(n, ".yml")) {
			files = append(files, path)
		}
		return nil
	})
	return files, err
}

// Error is a problem in a rules file, at a line and column.
type Error struct {
	File         string
	Line, Column int
	Field        string // "rules[1].rate"
	Msg          string
}

func (e *Error) Error() string {
	loc := e.File
	if e.Line > 0 {
		loc += fmt.Sprintf(":%d:%d", e.Line, e.Column)
	}
	if e.Field != "" {
		return fmt.Sprintf("%s: %s: %s", loc, e.Field, e.Msg)
	}
	return fmt.Sprintf("%s: %s", loc, e.Msg)
}

// Errors are all the problems found in one file.
type Errors []*Error

func (es Errors) Error() string {
	parts := make([]string, len(es))
	for i, e := range es {
		parts[i] = e.Error()
	}
	return strings.Join(parts, "\n")
}

type parser struct {
	file string
	errs Errors
}

func (p *parser) errorf(n *yaml.Node, field, format string, args ...any) {
	e := &Error{File: p.file, Field: field, Msg: fmt.Sprintf(format, args...)}
	if n != nil {
		e.Line, e.Column = n.Line, n.Column
	}
	p.errs = append(p.errs, e)
}

var namePattern = regexp.MustCompile(`^[A-Za-z0-9_.:-]{1,64}$`)

// Parse parses and validates a rules file; file names it in errors. All
// the problems found are returned together, as Errors.
func Parse(file string, data []byte) (*Config, error) {
	p := &parser{file: file}
	var doc yaml.Node
	if err := yaml.Unmarshal(data, &doc); err != nil {
		return nil, Errors{syntaxError(file, data, err)}
	}
	c := &Config{byName: map[string]int{}, Source: file}
	if len(doc.Content) == 0 {
		return nil, Errors{{File: file, Msg: "the file is empty: it needs a rules list"}}
	}
	root := doc.Content[0]
	if isEnvoy(root) {
		d := p.envoyDomain(root)
		if len(p.errs) > 0 {
			return nil, p.errs
		}
		c.Domains = map[string]*Domain{d.Name: d}
		return c, nil
	}
	if root.Kind != yaml.MappingNode {
		p.errorf(root, "", "the file must be a mapping with a rules list")
		return nil, p.errs
	}
	var rules, slots *yaml.Node
	for i := 0; i+1 < len(root.Content); i += 2 {
		k, v := root.Content[i], root.Content[i+1]
		switch k.Value {
		case "rules":
			rules = v
		case "concurrency":
			slots = v
		default:
			p.errorf(k, k.Value, "unknown top-level field (known: rules, concurrency; or domain and descriptors for an envoyproxy/ratelimit file)")
		}
	}
	switch {
	case rules == nil && slots != nil:
	case rules == nil:
		p.errorf(root, "rules", "missing")
	case rules.Kind != yaml.SequenceNode:
		p.errorf(rules, "rules", "must be a list")
	case len(rules.Content) == 0:
		p.errorf(rules, "rules", "must have at least one rule")
	case len(rules.Content) > MaxRules:
		p.errorf(rules, "rules", "has %d rules, more than the maximum %d", len(rules.Content), MaxRules)
	default:
		for i, rn := range rules.Content {
			if r, ok := p.rule(rn, fmt.Sprintf("rules[%d]", i)); ok {
				if j, dup := c.byName[r.Name]; dup {
					p.errorf(rn, fmt.Sprintf("rules[%d].name", i), "%q is already the name of rules[%d]", r.Name, j)
					continue
				}
				c.byName[r.Name] = len(c.Rules)
				c.Rules = append(c.Rules, r)
			}
		}
	}
	if slots != nil {
		p.concurrency(c, slots)
	}
	if len(p.errs) > 0 {
		return nil, p.errs
	}
	return c, nil
}

// fields returns a mapping's fields by name, reporting duplicates and
// fields not in known.
func (p *parser) fields(n *yaml.Node, path string, known ...string) map[string]*yaml.Node {
	out := map[string]*yaml.Node{}
	if n.Kind != yaml.MappingNode {
		p.errorf(n, path, "must be a mapping")
		return out
	}
	prefix := path + "."
	if path == "" {
		prefix = ""
	}
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := n.Content[i], n.Content[i+1]
		switch {
		case !contains(known, k.Value):
			p.errorf(k, prefix+k.Value, "unknown field (known: %s)", strings.Join(known, ", "))
		case out[k.Value] != nil:
			p.errorf(k, prefix+k.Value, "given twice")
		default:
			out[k.Value] = v
		}
	}
	return out
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

var limitFields = []string{"algorithm", "rate", "period", "burst", "capacity", "leak", "max_burst", "count", "limit", "window", "calendar", "timezone", "name"}

func (p *parser) rule(n *yaml.Node, path string) (Rule, bool) {
	before := len(p.errs)
	known := append([]string{"limits", "shadow", "on_change"}, limitFields...)
	f := p.fields(n, path, known...)
	var r Rule
	if name := f["name"]; name == nil {
		p.errorf(n, path+".name", "missing")
	} else if !namePattern.MatchString(name.Value) || name.Kind != yaml.ScalarNode {
		p.errorf(name, path+".name", "must be 1 to 64 letters, digits or _ . : -, got %q", name.Value)
	} else {
		r.Name = name.Value
	}
	if s := f["shadow"]; s != nil {
		switch s.Value {
		case "true":
			r.Shadow = true
		case "false":
		default:
			p.errorf(s, path+".shadow", "must be true or false, got %q", s.Value)
		}
	}
	if oc := f["on_change"]; oc != nil {
		st, err := floodgate.ParseStrategy(oc.Value)
		if err != nil || oc.Kind != yaml.ScalarNode {
			p.errorf(oc, path+".on_change", "must be one of additive, proportional, as-is, reset, got %q", oc.Value)
		}
		r.OnChange = st
	}
	if ls := f["limits"]; ls != nil {
		if f["algorithm"] != nil {
			p.errorf(ls, path+".limits", "give either limits or one limit's fields (algorithm, ...), not both")
		}
		if ls.Kind != yaml.SequenceNode || len(ls.Content) == 0 || len(ls.Content) > floodgate.MaxLimits {
			p.errorf(ls, path+".limits", "must be a list of 1 to %d limits", floodgate.MaxLimits)
		} else {
			for i, ln := range ls.Content {
				lp := fmt.Sprintf("%s.limits[%d]", path, i)
				if l, ok := p.limit(ln, lp, p.fields(ln, lp, limitFields...)); ok {
					r.Limits = append(r.Limits, l)
				}
			}
			p.logSum(ls, path+".limits", r.Limits)
		}
	} else {
		delete(f, "shadow")
		delete(f, "on_change")
		delete(f, "name")
		if l, ok := p.limit(n, path, f); ok {
			r.Limits = append(r.Limits, l.Named(r.Name))
		}
	}
	return r, len(p.errs) == before
}

// logAdvice says why a sliding log's limit is bounded and what to use
// instead.
const logAdvice = "a sliding log records every unit it admits; use sliding-window (the sliding window counter) for larger limits"

// logSum reports, at n, limits whose sliding logs admit more than
// MaxLogQuota together: one request checks them all, so the bound on its
// work is on their sum (see floodgate.MaxLogQuota).
func (p *parser) logSum(n *yaml.Node, field string, limits []floodgate.Limit) {
	var sum int64
	for _, l := range limits {
		if l.Algorithm() == floodgate.AlgorithmSlidingLog {
			sum += l.Quota()
		}
	}
	if sum > floodgate.MaxLogQuota {
		p.errorf(n, field, "the sliding-log limits add up to %d, more than the maximum %d: %s", sum, floodgate.MaxLogQuota, logAdvice)
	}
}

// limit builds one limit from its fields.
func (p *parser) limit(n *yaml.Node, path string, f map[string]*yaml.Node) (floodgate.Limit, bool) {
	before := len(p.errs)
	an := f["algorithm"]
	if an == nil {
		p.errorf(n, path+".algorithm", "missing (one of token-bucket, leaky-bucket, gcra, fixed-window, sliding-log, sliding-window)")
		return floodgate.Limit{}, false
	}
	alg, err := floodgate.ParseAlgorithm(an.Value)
	if err != nil {
		p.errorf(an, path+".algorithm", "unknown algorithm %q (one of token-bucket, leaky-bucket, gcra, fixed-window, sliding-log, sliding-window)", an.Value)
		return floodgate.Limit{}, false
	}
	var want []string
	switch alg {
	case floodgate.AlgorithmTokenBucket:
		want = []string{"rate", "period", "burst"}
	case floodgate.AlgorithmLeakyBucket:
		want = []string{"capacity", "leak", "period"}
	case floodgate.AlgorithmGCRA:
		want = []string{"max_burst", "count", "period"}
	case floodgate.AlgorithmFixedWindow:
		want = []string{"limit"}
		if f["calendar"] != nil {
			want = append(want, "calendar")
		} else {
			want = append(want, "window")
		}
	default:
		want = []string{"limit", "window"}
	}
	allowed := append([]string{"algorithm", "name", "timezone"}, want...)
	for k, v := range f {
		if !contains(allowed, k) || (k == "timezone" && f["calendar"] == nil) {
			p.errorf(v, path+"."+k, "is not a parameter of %s (it takes %s)", alg, strings.Join(want, ", "))
		}
	}
	ints := map[string]int64{}
	var dur time.Duration
	for _, k := range want {
		v := f[k]
		if v == nil {
			p.errorf(n, path+"."+k, "missing: %s takes %s", alg, strings.Join(want, ", "))
			continue
		}
		switch k {
		case "period", "window":
			dur = p.duration(v, path+"."+k)
		case "calendar":
		default:
			lo, hi := int64(1), int64(floodgate.MaxQuota)
			if k == "max_burst" {
				lo, hi = 0, floodgate.MaxQuota-1
			}
			if i, ok := p.integer(v, path+"."+k); ok && (i < lo || i > hi) {
				p.errorf(v, path+"."+k, "must be from %d to %d, got %d", lo, hi, i)
			} else {
				ints[k] = i
			}
		}
	}
	if q, ok := ints["limit"]; ok && alg == floodgate.AlgorithmSlidingLog && q > floodgate.MaxLogQuota {
		p.errorf(f["limit"], path+".limit", "must be at most %d for sliding-log, got %d: %s", floodgate.MaxLogQuota, q, logAdvice)
	}
	if len(p.errs) > before {
		return floodgate.Limit{}, false
	}
	var l floodgate.Limit
	switch alg {
	case floodgate.AlgorithmTokenBucket:
		l = floodgate.TokenBucket(ints["rate"], dur, ints["burst"])
	case floodgate.AlgorithmLeakyBucket:
		l = floodgate.LeakyBucket(ints["capacity"], ints["leak"], dur)
	case floodgate.AlgorithmGCRA:
		l = floodgate.GCRA(ints["max_burst"], ints["count"], dur)
	case floodgate.AlgorithmFixedWindow:
		if cn := f["calendar"]; cn != nil {
			var unit floodgate.Calendar
			switch cn.Value {
			case "day":
				unit = floodgate.Day
			case "week":
				unit = floodgate.Week
			case "month":
				unit = floodgate.Month
			default:
				p.errorf(cn, path+".calendar", "must be day, week or month, got %q", cn.Value)
				return floodgate.Limit{}, false
			}
			loc := time.UTC
			if tz := f["timezone"]; tz != nil {
				if loc, err = time.LoadLocation(tz.Value); err != nil || tz.Value == "" {
					p.errorf(tz, path+".timezone", "unknown time zone %q", tz.Value)
					return floodgate.Limit{}, false
				}
			}
			l = floodgate.CalendarWindow(ints["limit"], unit, loc)
		} else {
			l = floodgate.FixedWindow(ints["limit"], dur)
		}
	case floodgate.AlgorithmSlidingLog:
		l = floodgate.SlidingLog(ints["limit"], dur)
	case floodgate.AlgorithmSlidingWindow:
		l = floodgate.SlidingWindow(ints["limit"], dur)
	}
	if err := l.Validate(); err != nil {
		p.errorf(n, path, "%s", strings.TrimPrefix(err.Error(), floodgate.ErrInvalidLimit.Error()+": "))
		return floodgate.Limit{}, false
	}
	if nn := f["name"]; nn != nil {
		l = l.Named(nn.Value)
	}
	return l, true
}

// integer reads a whole number. Floats, NaN and infinities are refused
// rather than rounded: a limit is a count.
func (p *parser) integer(v *yaml.Node, path string) (int64, bool) {
	if v.Kind != yaml.ScalarNode {
		p.errorf(v, path, "must be a whole number")
		return 0, false
	}
	s := strings.ReplaceAll(v.Value, "_", "")
	i, err := strconv.ParseInt(s, 10, 64)
	if err == nil {
		return i, true
	}
	lower := strings.ToLower(s)
	_, ferr := strconv.ParseFloat(s, 64)
	switch {
	case strings.Contains(lower, "nan"):
		p.errorf(v, path, "must be a whole number, got NaN (%s)", v.Value)
	case strings.Contains(lower, "inf"):
		p.errorf(v, path, "must be a whole number, got infinity (%s)", v.Value)
	case errors.Is(err, strconv.ErrRange):
		p.errorf(v, path, "%s is out of range (at most %d)", v.Value, int64(floodgate.MaxQuota))
	case ferr == nil:
		p.errorf(v, path, "must be a whole number, got %s: write a longer period instead of a fraction", v.Value)
	default:
		p.errorf(v, path, "must be a whole number, got %q", v.Value)
	}
	return 0, false
}

// duration reads a Go duration such as 1s, 1m30s or 500ms.
func (p *parser) duration(v *yaml.Node, path string) time.Duration {
	d, err := time.ParseDuration(v.Value)
	if err != nil || v.Kind != yaml.ScalarNode {
		p.errorf(v, path, "must be a duration such as 1s, 1m or 500ms, got %q", v.Value)
		return 0
	}
	return d
}
