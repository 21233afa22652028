package config

import (
	"fmt"

	"go.yaml.in/yaml/v3"
)

// ParseEnvoyNode reads one envoyproxy/ratelimit domain from root, a YAML
// mapping that a program built rather than read from a file (package
// xds builds one from each RateLimitConfig resource), and validates it
// as a domain file's: the same fields, limits and errors. source names it
// in errors and in the Domain's File; nodes without a line (built ones)
// give errors without a position.
func ParseEnvoyNode(source string, root *yaml.Node) (*Domain, error) {
	if root == nil || !isEnvoy(root) {
		return nil, Errors{{File: source, Field: "domain", Msg: "config file cannot have empty domain"}}
	}
	p := &parser{file: source}
	d := p.envoyDomain(root)
	if len(p.errs) > 0 {
		return nil, p.errs
	}
	return d, nil
}

// FromDomains returns the configuration of ds alone, with no rules, as
// LoadWith joins the domains of a directory's files: a domain given twice
// is an error, unless merge, which merges them as MergeDomains does.
// source is the configuration's Source.
func FromDomains(source string, ds []*Domain, merge bool) (*Config, error) {
	c := &Config{byName: map[string]int{}, Source: source, Domains: map[string]*Domain{}}
	var errs Errors
	for _, d := range ds {
		if d == nil {
			return nil, fmt.Errorf("config: FromDomains: a nil domain")
		}
		if err := c.addDomain(d, merge); err != nil {
			errs = append(errs, err.(*Error))
		}
	}
	if len(errs) > 0 {
		return nil, errs
	}
	return c, nil
}
