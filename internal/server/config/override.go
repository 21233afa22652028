package config

import (
	"fmt"
	"time"

	"github.com/floodgate/floodgate"
	"go.yaml.in/yaml/v3"
)

// Override is a key's own limits as a client sends them (the body of
// PUT /v1/overrides/{rule}/{key}, or FG.OVERRIDE SET's argument): a rule's
// fields, for one limit or a limits list, with how long it lasts and how
// the key's usage carries over.
type Override struct {
	Limits   []floodgate.Limit
	TTL      time.Duration
	Strategy floodgate.Strategy
}

// ParseOverride parses an override, in JSON or YAML: the fields of one
// limit as a rules file gives them (algorithm, rate, period, burst, ...),
// or "limits", a list of them, and optionally "ttl" (a duration such as
// 1h, in whole milliseconds; none for ever) and "strategy" (additive, the
// default, as-is, proportional or reset). file names the input in errors,
// which come as Errors with lines and columns.
func ParseOverride(file string, data []byte) (Override, error) {
	p := &parser{file: file}
	var doc yaml.Node
	if err := yaml.Unmarshal(data, &doc); err != nil {
		return Override{}, Errors{syntaxError(file, data, err)}
	}
	if len(doc.Content) == 0 {
		return Override{}, Errors{{File: file, Msg: "empty: an override needs a limit (algorithm, ...) or a limits list"}}
	}
	root := doc.Content[0]
	known := append([]string{"limits", "ttl", "strategy"}, limitFields...)
	f := p.fields(root, "", known...)
	var o Override
	if v := f["ttl"]; v != nil {
		o.TTL = p.duration(v, "ttl")
		if o.TTL < 0 || o.TTL%time.Millisecond != 0 {
			p.errorf(v, "ttl", "must be a positive whole number of milliseconds, got %s", v.Value)
		}
	}
	if v := f["strategy"]; v != nil {
		st, err := floodgate.ParseStrategy(v.Value)
		if err != nil || v.Kind != yaml.ScalarNode {
			p.errorf(v, "strategy", "must be additive, as-is, proportional or reset, got %q", v.Value)
		}
		o.Strategy = st
	}
	delete(f, "ttl")
	delete(f, "strategy")
	if ls := f["limits"]; ls != nil {
		if f["algorithm"] != nil {
			p.errorf(ls, "limits", "give either limits or one limit's fields (algorithm, ...), not both")
		}
		if ls.Kind != yaml.SequenceNode || len(ls.Content) == 0 || len(ls.Content) > floodgate.MaxLimits {
			p.errorf(ls, "limits", "must be a list of 1 to %d limits", floodgate.MaxLimits)
		} else {
			for i, ln := range ls.Content {
				lp := fmt.Sprintf("limits[%d]", i)
				if l, ok := p.limit(ln, lp, p.fields(ln, lp, limitFields...)); ok {
					o.Limits = append(o.Limits, l)
				}
			}
			p.logSum(ls, "limits", o.Limits)
		}
	} else if len(p.errs) == 0 {
		if l, ok := p.limit(root, "override", f); ok {
			o.Limits = append(o.Limits, l)
		}
	}
	for i, l := range o.Limits {
		if cal, _ := l.Calendar(); cal != 0 {
			p.errorf(root, fmt.Sprintf("limits[%d]", i), "an override cannot be a calendar window; use a fixed window of 24h, 168h or 720h")
		}
	}
	if len(p.errs) > 0 {
		return Override{}, p.errs
	}
	return o, nil
}
