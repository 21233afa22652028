package config

import (
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/floodgate/floodgate"
)

// envoyExample is envoyproxy/ratelimit's README examples, in one domain.
const envoyExample = `domain: example
descriptors:
  - key: database
    value: users
    rate_limit:
      unit: second
      requests_per_unit: 500
  - key: message_type
    value: marketing
    descriptors:
      - key: to_number
        rate_limit:
          unit: day
          requests_per_unit: 5
  - key: remote_address
    rate_limit:
      unit: second
      requests_per_unit: 10
  - key: key1
    value: value*
    rate_limit:
      unit: minute
      requests_per_unit: 20
  - key: files
    value: /api/*
    share_threshold: true
    rate_limit:
      unit: hour
      requests_per_unit: 100
  - key: unlimited
    rate_limit:
      unlimited: true
  - key: named
    rate_limit: {unit: minute, requests_per_unit: 3, name: low, replaces: [{name: high}]}
  - key: bucket
    rate_limit: {unit: second, requests_per_unit: 10, algorithm: token-bucket, burst: 30}
  - key: tenminutes
    rate_limit: {unit: minute, unit_multiplier: 10, requests_per_unit: 7}
  - key: blocked
    rate_limit: {unit: second, requests_per_unit: 0}
`

func TestEnvoyParse(t *testing.T) {
	c, err := Parse("example.yaml", []byte(envoyExample))
	if err != nil {
		t.Fatal(err)
	}
	d := c.Domains["example"]
	if d == nil || len(c.Rules) != 0 {
		t.Fatalf("Domains = %v, Rules = %v", c.Domains, c.Rules)
	}
	for _, tc := range []struct {
		name  string
		limit floodgate.Limit
		count bool
	}{
		{"database_users", floodgate.FixedWindow(500, time.Second), true},
		{"remote_address", floodgate.FixedWindow(10, time.Second), true},
		{"bucket", floodgate.TokenBucket(10, time.Second, 30), false},
		{"tenminutes", floodgate.FixedWindow(7, 10*time.Minute), true},
		{"blocked", floodgate.Limit{}, true},
	} {
		l := d.Root.Children[tc.name].Limit
		if l.Limit != tc.limit || l.Counting != tc.count {
			t.Errorf("%s: limit %v counting %v, want %v %v", tc.name, l.Limit, l.Counting, tc.limit, tc.count)
		}
	}
	if l := d.Root.Children["unlimited"].Limit; !l.Unlimited {
		t.Errorf("unlimited: %+v", l)
	}
	if l := d.Root.Children["named"].Limit; l.Name != "low" || len(l.Replaces) != 1 || l.Replaces[0] != "high" {
		t.Errorf("named: %+v", l)
	}
}

func TestEnvoyLookup(t *testing.T) {
	c, err := Parse("example.yaml", []byte(envoyExample))
	if err != nil {
		t.Fatal(err)
	}
	d := c.Domains["example"]
	for _, tc := range []struct {
		entries []Entry
		stat    string // "" for no limit
		shared  string // the first entry's shared pattern
	}{
		{[]Entry{{"database", "users"}}, "example.database_users", ""},
		{[]Entry{{"database", "other"}}, "", ""},
		{[]Entry{{"remote_address", "10.0.0.1"}}, "example.remote_address", ""},
		{[]Entry{{"message_type", "marketing"}, {"to_number", "2061234567"}}, "example.message_type_marketing.to_number", ""},
		{[]Entry{{"message_type", "marketing"}}, "", ""},                                  // the limit is one level down
		{[]Entry{{"remote_address", "a"}, {"extra", "b"}}, "", ""},                        // deeper than the config
		{[]Entry{{"key1", "value1"}}, "example.key1_value*", ""},                          // trailing wildcard
		{[]Entry{{"key1", "valu"}}, "", ""},                                               // not the prefix
		{[]Entry{{"files", "/api/a"}}, "example.files_/api/*", "/api/*"},                  // share_threshold
		{[]Entry{{"files", "/api/b"}}, "example.files_/api/*", "/api/*"},                  // the same counter
		{[]Entry{{"unlimited", "x"}}, "example.unlimited", ""},                            //
		{[]Entry{{"tenminutes", ""}}, "example.tenminutes", ""},                           //
		{[]Entry{{"nope", "x"}}, "", ""},                                                  //
		{[]Entry{{"message_type", "marketing"}, {"to_number", "1"}, {"x", "y"}}, "", ""},  //
		{[]Entry{{"message_type", "transactional"}, {"to_number", "2061234567"}}, "", ""}, //
		{[]Entry{{"remote_address", ""}}, "example.remote_address", ""},                   //
		{[]Entry{}, "", ""}, //
		{[]Entry{{"database", "users"}, {"database", "users"}}, "", ""},                                             //
		{[]Entry{{"bucket", "k"}}, "example.bucket", ""},                                                            //
		{[]Entry{{"key1", "value"}}, "example.key1_value*", ""},                                                     // * matches the empty rest
		{[]Entry{{"files", "/api/"}}, "example.files_/api/*", "/api/*"},                                             //
		{[]Entry{{"files", "/other"}}, "", ""},                                                                      //
		{[]Entry{{"named", "a"}}, "example.named", ""},                                                              //
		{[]Entry{{"blocked", "a"}}, "example.blocked", ""},                                                          //
		{[]Entry{{"message_type", "marketing"}, {"to_number", ""}}, "example.message_type_marketing.to_number", ""}, //
	} {
		m := d.Lookup(tc.entries)
		if m.StatKey != tc.stat {
			t.Errorf("%v: StatKey %q, want %q", tc.entries, m.StatKey, tc.stat)
		}
		if got := ""; m.Shared != nil {
			got = m.Shared[0]
			if got != tc.shared {
				t.Errorf("%v: shared %q, want %q", tc.entries, got, tc.shared)
			}
		} else if tc.shared != "" {
			t.Errorf("%v: not shared, want %q", tc.entries, tc.shared)
		}
	}
}

// TestEnvoyInvalid holds the files envoyproxy/ratelimit rejects, and those
// it lets through that floodgate rejects (unknown fields in the wrong
// place, bad values): each with its position.
func TestEnvoyInvalid(t *testing.T) {
	for _, tc := range []struct {
		name, yaml, want string
	}{
		{"empty domain", "domain: \"\"\ndescriptors: []\n", `x.yaml:1:9: domain: config file cannot have empty domain`},
		{"empty key", "domain: d\ndescriptors:\n  - value: v\n", `x.yaml:3:5: descriptors[0].key: descriptor has empty key`},
		{"duplicate key", "domain: d\ndescriptors:\n  - key: k\n  - key: k\n", `x.yaml:4:5: descriptors[1]: duplicate descriptor composite key 'd.k'`},
		{"duplicate key and value", "domain: d\ndescriptors:\n  - {key: k, value: v}\n  - {key: k, value: v}\n", `duplicate descriptor composite key 'd.k_v'`},
		{"bad unit", "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: fortnight, requests_per_unit: 1}\n", `x.yaml:4:24: descriptors[0].rate_limit.unit: invalid rate limit unit 'fortnight'`},
		{"no unit", "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {requests_per_unit: 1}\n", `invalid rate limit unit ''`},
		{"unlimited with unit", "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unlimited: true, unit: second}\n", `x.yaml:4:41: descriptors[0].rate_limit.unit: should not specify rate limit unit when unlimited`},
		{"replaces itself", "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1, name: a, replaces: [{name: a}]}\n", `replaces should not contain name of same descriptor`},
		{"empty replaces", "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1, replaces: [{name: \"\"}]}\n", `should not have an empty replaces entry`},
		{"unknown field", "domain: d\ndescriptors:\n  - key: k\n    ratelimit: {unit: second}\n", `x.yaml:4:5: descriptors[0].ratelimit: unknown field`},
		{"unknown top-level field", "domain: d\nrules: []\n", `x.yaml:2:1: rules: unknown field`},
		{"share_threshold without wildcard", "domain: d\ndescriptors:\n  - key: k\n    value: v\n    share_threshold: true\n", `share_threshold can only be used with wildcard values (containing '*'), but found key 'k_v'`},
		{"negative requests", "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: -1}\n", `requests_per_unit: must be from 0 to 4294967295, got -1`},
		{"fractional requests", "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1.5}\n", `must be a whole number, got 1.5`},
		{"not a bool", "domain: d\ndescriptors:\n  - key: k\n    shadow_mode: yes\n", `shadow_mode: must be true or false, got "yes"`},
		{"unknown algorithm", "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1, algorithm: magic}\n", `unknown algorithm "magic"`},
		{"burst without algorithm", "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1, burst: 5}\n", `burst needs an algorithm`},
		{"sliding log over its maximum", "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: day, requests_per_unit: 5000000, algorithm: sliding-log}\n",
			`x.yaml:4:48: descriptors[0].rate_limit.requests_per_unit: must be at most 250 with sliding-log, got 5000000: a sliding log records every unit it admits; use sliding-window`},
		{"burst on a window", "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1, algorithm: sliding-window, burst: 5}\n", `burst: is not a parameter of sliding-window`},
		{"zero multiplier", "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1, unit_multiplier: 0}\n", `unit_multiplier: must be from 1 to`},
		{"descriptors not a list", "domain: d\ndescriptors: {key: k}\n", `descriptors: must be a list of descriptors`},
		{"metadata not a mapping", "domain: d\ndescriptors:\n  - key: k\n    metadata: 5\n", `x.yaml:4:15: descriptors[0].metadata: must be a mapping`},
		{"metadata a list", "domain: d\ndescriptors:\n  - key: k\n    metadata: [a]\n", `descriptors[0].metadata: must be a mapping`},
		{"metadata key not a string", "domain: d\ndescriptors:\n  - key: k\n    metadata: {[a]: b}\n", `descriptors[0].metadata: a key must be a string`},
		{"unlimited with algorithm", "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unlimited: true, algorithm: gcra}\n", `an unlimited rate_limit takes no algorithm`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Parse("x.yaml", []byte(tc.yaml))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %v, want it to contain %q", err, tc.want)
			}
		})
	}
}

// writeIn writes body to the file name in dir.
func writeIn(t *testing.T, dir, name, body string) {
	t.Helper()
	if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
}

func TestLoadDirectory(t *testing.T) {
	dir := t.TempDir()
	writeIn(t, dir, "a.yaml", "domain: a\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1}\n")
	writeIn(t, dir, "b.yml", "domain: b\n")
	writeIn(t, dir, "rules.yaml", ExampleYAML)
	writeIn(t, dir, ".hidden.yaml", "not: [valid")
	writeIn(t, dir, "notes.txt", "ignored")
	// Directories below are read too, as envoyproxy/ratelimit's runtime
	// loader walks them; dot directories (a mounted ConfigMap's ..data,
	// whose files the links beside it name) are not.
	for _, sub := range []string{"team/edge", "..data"} {
		if err := os.MkdirAll(filepath.Join(dir, sub), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	writeIn(t, filepath.Join(dir, "team/edge"), "e.yaml", "domain: e\n")
	writeIn(t, filepath.Join(dir, "..data"), "e.yaml", "domain: e\n") // read, it would be a duplicate
	writeIn(t, filepath.Join(dir, "..data"), "f.yaml", "domain: f\n")
	if err := os.Symlink(filepath.Join("..data", "f.yaml"), filepath.Join(dir, "linked.yml")); err != nil {
		t.Fatal(err)
	}
	c, err := Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(c.Domains) != 4 || c.Domains["a"] == nil || c.Domains["b"] == nil || c.Domains["e"] == nil || c.Domains["f"] == nil || len(c.Rules) != 1 {
		t.Fatalf("Domains %v, Rules %v", c.Domains, c.Rules)
	}
	if d := c.Domains["e"]; d.File != filepath.Join(dir, "team/edge/e.yaml") {
		t.Errorf("domain e from %s", d.File)
	}

	// Two files of one domain, as envoyproxy/ratelimit refuses them.
	writeIn(t, dir, "c.yaml", "domain: a\n")
	_, err = Load(dir)
	if err == nil || !strings.Contains(err.Error(), "c.yaml:1:1: domain: duplicate domain 'a' in config file (also in "+filepath.Join(dir, "a.yaml")+")") {
		t.Errorf("duplicate domain: %v", err)
	}
	os.Remove(filepath.Join(dir, "c.yaml"))
	// A bad file fails the whole directory, with its own position.
	writeIn(t, dir, "d.yaml", "domain: d\ndescriptors:\n  - key: \"\"\n")
	if _, err = Load(dir); err == nil || !strings.Contains(err.Error(), "d.yaml:3:10: descriptors[0].key: descriptor has empty key") {
		t.Errorf("bad file: %v", err)
	}
	if _, err = Load(t.TempDir()); err == nil || !strings.Contains(err.Error(), "no *.yaml or *.yml file") {
		t.Errorf("empty directory: %v", err)
	}
}

// TestMergeDomains: with MergeDomains, the files of one domain make one
// tree, as envoyproxy/ratelimit's MERGE_DOMAIN_CONFIG patches a domain,
// and a top-level descriptor in two files is an error.
func TestMergeDomains(t *testing.T) {
	dir := t.TempDir()
	writeIn(t, dir, "a.yaml", "domain: d\ndescriptors:\n  - {key: ip, rate_limit: {unit: second, requests_per_unit: 1}}\n  - {key: path, value: /a*, rate_limit: {unit: second, requests_per_unit: 2}}\n")
	writeIn(t, dir, "b.yaml", "domain: d\ndescriptors:\n  - {key: user, rate_limit: {unit: minute, requests_per_unit: 3}}\n  - {key: path, value: /*, rate_limit: {unit: second, requests_per_unit: 4}}\n")
	if _, err := Load(dir); err == nil || !strings.Contains(err.Error(), "duplicate domain 'd'") {
		t.Fatalf("without MergeDomains: %v", err)
	}
	c, err := LoadWith(dir, LoadOptions{MergeDomains: true})
	if err != nil {
		t.Fatal(err)
	}
	d := c.Domains["d"]
	for _, tc := range []struct {
		entries []Entry
		rpu     uint32
	}{
		{[]Entry{{"ip", "x"}}, 1},
		{[]Entry{{"user", "u"}}, 3},
		{[]Entry{{"path", "/ab"}}, 2}, // a.yaml's wildcard comes first
		{[]Entry{{"path", "/b"}}, 4},
	} {
		if m := d.Lookup(tc.entries); m.Limit == nil || m.Limit.RequestsPerUnit != tc.rpu {
			t.Errorf("%v: %+v, want %d per unit", tc.entries, m.Limit, tc.rpu)
		}
	}
	writeIn(t, dir, "c.yaml", "domain: d\ndescriptors:\n  - {key: ip, rate_limit: {unit: second, requests_per_unit: 9}}\n")
	_, err = LoadWith(dir, LoadOptions{MergeDomains: true})
	if err == nil || !strings.Contains(err.Error(), "c.yaml:1:1: descriptors: duplicate descriptor composite key 'd.ip' (also in "+filepath.Join(dir, "a.yaml")+")") {
		t.Errorf("a descriptor in two files: %v", err)
	}
}

// TestEnvoyStatKeys names statistics as envoyproxy/ratelimit does with
// detailed_metric and value_to_metric.
func TestEnvoyStatKeys(t *testing.T) {
	c, err := Parse("m.yaml", []byte(`domain: m
descriptors:
  - key: route
    value_to_metric: true
    descriptors:
      - key: method
        rate_limit: {unit: second, requests_per_unit: 1}
  - key: user
    detailed_metric: true
    rate_limit: {unit: second, requests_per_unit: 1}
  - key: api
    value: v1*
    value_to_metric: true
    rate_limit: {unit: second, requests_per_unit: 1}
  - key: files
    value: /f/*
    share_threshold: true
    detailed_metric: true
    rate_limit: {unit: second, requests_per_unit: 1}
`))
	if err != nil {
		t.Fatal(err)
	}
	d := c.Domains["m"]
	for _, tc := range []struct {
		entries []Entry
		stat    string
	}{
		{[]Entry{{"route", "/home"}, {"method", "GET"}}, "m.route_/home.method"},
		{[]Entry{{"user", "alice"}}, "m.user_alice"},
		{[]Entry{{"api", "v1beta"}}, "m.api_v1beta"},
		{[]Entry{{"files", "/f/a"}}, "m.files_/f/*"},
	} {
		if got := d.Lookup(tc.entries).StatKey; got != tc.stat {
			t.Errorf("%v: %q, want %q", tc.entries, got, tc.stat)
		}
	}
}

// wildcardConfig has wildcards anywhere in a value, as envoyproxy/ratelimit
// has them since March 2026 (its README's Example 9): in the middle,
// several, with share_threshold, nested, and descriptors with metadata.
const wildcardConfig = `domain: w
descriptors:
  - key: path
    value: /api/*/action
    rate_limit: {unit: minute, requests_per_unit: 20}
  - key: route
    value: /api/*/resource/*/action
    rate_limit: {unit: minute, requests_per_unit: 21}
  - key: route
    value: /api/v1/resource/1/action
    rate_limit: {unit: minute, requests_per_unit: 22}
  - key: mid
    value: /a*v1
    share_threshold: true
    metadata:
      tier: gold
      nested: {list: [1, two, {three: 3}], "n": ~}
    rate_limit: {unit: hour, requests_per_unit: 23}
  - key: multi
    value: s*e*c
    share_threshold: true
    value_to_metric: true
    rate_limit: {unit: hour, requests_per_unit: 24}
  - key: tenant
    value: t*prod
    share_threshold: true
    metadata: ~
    descriptors:
      - key: res
        value: r*v2
        share_threshold: true
        rate_limit: {unit: day, requests_per_unit: 25}
  - key: any
    value: "*"
    metadata: {}
    rate_limit: {unit: second, requests_per_unit: 26}
`

// TestEnvoyWildcardsAnywhere: a * anywhere in a value matches any run of
// characters, as in envoyproxy/ratelimit's main branch since March 2026;
// share_threshold takes them, and a descriptor may have metadata. Before,
// a * that did not end the value matched only itself, and metadata or
// share_threshold on such a value refused the file.
func TestEnvoyWildcardsAnywhere(t *testing.T) {
	c, err := Parse("w.yaml", []byte(wildcardConfig))
	if err != nil {
		t.Fatal(err)
	}
	d := c.Domains["w"]
	for _, tc := range []struct {
		entries []Entry
		rpu     uint32 // 0: no limit
		stat    string
		shared  []string
	}{
		{[]Entry{{"path", "/api/123/action"}}, 20, "w.path_/api/*/action", nil},
		{[]Entry{{"path", "/api/user-id/action"}}, 20, "w.path_/api/*/action", nil},
		{[]Entry{{"path", "/api//action"}}, 20, "w.path_/api/*/action", nil}, // * matches nothing too
		{[]Entry{{"path", "/api/123/other"}}, 0, "", nil},
		{[]Entry{{"path", "/api/action"}}, 0, "", nil}, // "/api/" and "/action" would overlap
		{[]Entry{{"route", "/api/v1/resource/123/action"}}, 21, "w.route_/api/*/resource/*/action", nil},
		{[]Entry{{"route", "/api/v1/resource/1/action"}}, 22, "w.route_/api/v1/resource/1/action", nil}, // the value itself first
		{[]Entry{{"route", "/api/resource/x/action"}}, 0, "", nil},
		{[]Entry{{"route", "/api/a/action/resource/b/action"}}, 21, "w.route_/api/*/resource/*/action", nil},
		{[]Entry{{"mid", "/a/b/v1"}}, 23, "w.mid_/a*v1", []string{"/a*v1"}},
		{[]Entry{{"mid", "/av1"}}, 23, "w.mid_/a*v1", []string{"/a*v1"}},
		{[]Entry{{"mid", "/a/v1/x"}}, 0, "", nil},
		{[]Entry{{"multi", "sec"}}, 24, "w.multi_s*e*c", []string{"s*e*c"}},
		{[]Entry{{"multi", "s_x_e_y_c"}}, 24, "w.multi_s*e*c", []string{"s*e*c"}},
		{[]Entry{{"multi", "sc"}}, 0, "", nil},
		{[]Entry{{"tenant", "t1prod"}, {"res", "r9v2"}}, 25, "w.tenant_t*prod.res_r*v2", []string{"t*prod", "r*v2"}},
		{[]Entry{{"tenant", "t1prod"}, {"res", "r9v3"}}, 0, "", nil},
		{[]Entry{{"any", ""}}, 26, "w.any_*", nil},
		{[]Entry{{"any", "x*y"}}, 26, "w.any_*", nil},
	} {
		m := d.Lookup(tc.entries)
		rpu := uint32(0)
		if m.Limit != nil {
			rpu = m.Limit.RequestsPerUnit
		}
		if rpu != tc.rpu || m.StatKey != tc.stat || !slices.Equal(m.Shared, tc.shared) {
			t.Errorf("%v: %d per unit, stat %q, shared %q; want %d, %q, %q", tc.entries, rpu, m.StatKey, m.Shared, tc.rpu, tc.stat, tc.shared)
		}
	}
}

// TestWildcardMatch holds the corners of a * matching: overlapping ends,
// the empty run, several * side by side, and a * in the request's value,
// which is a character like any other.
func TestWildcardMatch(t *testing.T) {
	for _, tc := range []struct {
		pattern, name string
		want          bool
	}{
		{"k_*", "k_", true},
		{"k_*", "k_x", true},
		{"k_*", "k", false},
		{"k_a*a", "k_a", false},
		{"k_a*a", "k_aa", true},
		{"k_a*a", "k_aba", true},
		{"k_a*b*a", "k_aba", true},
		{"k_a*b*a", "k_aa", false},
		{"k_a**b", "k_ab", true},
		{"k_*x*", "k_abc", false},
		{"k_*x*", "k_x", true},
		{"k_*ab*ab", "k_abab", true},
		{"k_*ab*ab", "k_aab", false},
		{"k_x*y", "k_x*y", true},
		{"k*", "kx_y", true}, // a * in the key, as envoyproxy/ratelimit matches it
	} {
		if got := newWildcard(tc.pattern).Match(tc.name); got != tc.want {
			t.Errorf("%q matches %q: %t, want %t", tc.pattern, tc.name, got, tc.want)
		}
	}
}

// FuzzWildcardMatch checks Match against a regular expression of the
// same pattern, each * a (?s).*.
func FuzzWildcardMatch(f *testing.F) {
	f.Add("a*b*a", "abba")
	f.Add("*x*", "yxy")
	f.Add("**", "")
	f.Fuzz(func(t *testing.T, pattern, name string) {
		if !strings.Contains(pattern, "*") || !utf8.ValidString(pattern) || len(pattern) > 64 || len(name) > 256 {
			return
		}
		parts := strings.Split(pattern, "*")
		for i, p := range parts {
			parts[i] = regexp.QuoteMeta(p)
		}
		re := regexp.MustCompile(`^(?s)` + strings.Join(parts, ".*") + `$`)
		if got, want := newWildcard(pattern).Match(name), re.MatchString(name); got != want {
			t.Errorf("%q matches %q: %t, want %t", pattern, name, got, want)
		}
	})
}
