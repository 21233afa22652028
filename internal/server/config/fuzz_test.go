package config

import (
	"errors"
	"strings"
	"testing"
)

// FuzzParse feeds Parse and ParseOverride any bytes, in either rules
// format: each gives a result or an error with the file's name, never a
// panic, and a domain that parses answers lookups of any descriptor.
// CI runs the seeds; `go test -fuzz FuzzParse ./internal/server/config` explores.
func FuzzParse(f *testing.F) {
	for _, s := range []string{
		envoyExample,
		wildcardConfig,
		"rules:\n  - {name: api, algorithm: token-bucket, rate: 100, period: 1m, burst: 200}\n",
		"rules:\n  - name: tiered\n    limits:\n      - {algorithm: fixed-window, limit: 10000, calendar: day, timezone: Europe/Paris}\n",
		"domain: d\ndescriptors:\n  - key: k\n    value: v*\n    share_threshold: true\n    descriptors:\n      - key: u\n        rate_limit: {unit: second, requests_per_unit: 1}\n",
		"domain: d\ndescriptors:\n  - key: k\n    detailed_metric: true\n    value_to_metric: true\n    rate_limit: {unit: minute, unit_multiplier: 10, requests_per_unit: 7, name: a, replaces: [{name: b}]}\n",
		"limits:\n  - {algorithm: gcra, count: 10, period: 1s, max_burst: 9}\nttl: 1h\nstrategy: reset\n",
		"domain: \"\"\n",
		"{",
		"",
	} {
		f.Add(s, "k", "v", "k2", "v2")
	}
	f.Fuzz(func(t *testing.T, data, k1, v1, k2, v2 string) {
		c, err := Parse("x.yaml", []byte(data))
		if err != nil {
			var es Errors
			if !errors.As(err, &es) || len(es) == 0 {
				t.Fatalf("error %v (%T), want Errors", err, err)
			}
			if !strings.Contains(err.Error(), "x.yaml") {
				t.Fatalf("error %q does not name the file", err)
			}
		} else {
			for _, d := range c.Domains {
				for _, entries := range [][]Entry{{{k1, v1}}, {{k1, v1}, {k2, v2}}, {{"k", v1}, {k2, v2}}} {
					if m := d.Lookup(entries); m.Limit != nil && m.StatKey == "" {
						t.Fatalf("%v matched a limit without a statistics key", entries)
					}
				}
			}
		}
		ParseOverride("x.yaml", []byte(data))
	})
}
