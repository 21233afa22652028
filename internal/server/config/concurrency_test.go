package config

import (
	"strings"
	"testing"
	"time"
)

func TestConcurrencyRules(t *testing.T) {
	c, err := Parse("t.yaml", []byte(`rules:
  - {name: api, algorithm: token-bucket, rate: 10, period: 1s, burst: 10}
concurrency:
  - name: exports
    slots: 50
    lease: 5m
  - {name: llm, slots: 2, lease: 30s, rules: [api]}
`))
	if err != nil {
		t.Fatal(err)
	}
	if s, ok := c.ConcurrencyRule("llm"); !ok || s.Slots != 2 || s.Lease != 30*time.Second || len(s.Rules) != 1 || s.Rules[0] != "api" {
		t.Fatalf("llm: %+v %v", s, ok)
	}
	if s, ok := c.ConcurrencyRule("exports"); !ok || s.Slots != 50 || s.Lease != 5*time.Minute || s.Rules != nil {
		t.Fatalf("exports: %+v %v", s, ok)
	}
	// A file of concurrency rules alone.
	if c, err := Parse("t.yaml", []byte("concurrency: [{name: x, slots: 1, lease: 1s}]\n")); err != nil || len(c.Concurrency) != 1 {
		t.Fatalf("%+v %v", c, err)
	}
	for _, tc := range []struct{ yaml, want string }{
		{"concurrency: [{name: x, slots: 0, lease: 1s}]", "concurrency[0].slots: must be from 1 to 10000, got 0"},
		{"concurrency: [{name: x, slots: -3, lease: 1s}]", "concurrency[0].slots: must be from 1"},
		{"concurrency: [{name: x, slots: 10001, lease: 1s}]", "must be from 1 to 10000"},
		{"concurrency: [{name: x, slots: 1.5, lease: 1s}]", "must be a whole number"},
		{"concurrency: [{name: x, slots: 1, lease: 0s}]", "concurrency[0].lease: must be a positive"},
		{"concurrency: [{name: x, slots: 1, lease: 90000h}]", "concurrency[0].lease: must be a positive"},
		{"concurrency: [{name: x, slots: 1, lease: 1ns}]", "concurrency[0].lease: must be a positive"},
		{"concurrency: [{name: x, slots: 1}]", "concurrency[0].lease: missing"},
		{"concurrency: [{slots: 1, lease: 1s}]", "concurrency[0].name: missing"},
		{"concurrency: [{name: x, slots: 1, lease: 1s, rules: [nope]}]", `"nope" is not a rule of this file`},
		// A rule twice would be charged twice by each acquire.
		{"rules: [{name: api, algorithm: token-bucket, rate: 10, period: 1s, burst: 10}]\nconcurrency: [{name: x, slots: 1, lease: 1s, rules: [api, api]}]", `concurrency[0].rules[1]: "api" is listed twice`},
		{"concurrency: [{name: x, slots: 1, lease: 1s}, {name: x, slots: 1, lease: 1s}]", "names another concurrency rule"},
		{"concurrency: [{name: x, slots: 1, lease: 1s, burst: 3}]", "concurrency[0].burst: unknown field"},
		{"concurrency: []", "must be a list of 1 to"},
	} {
		_, err := Parse("t.yaml", []byte(tc.yaml+"\n"))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want %q", tc.yaml, err, tc.want)
		}
	}
}

func TestEnvoyConcurrencyDescriptors(t *testing.T) {
	c, err := Parse("api.yaml", []byte("domain: api\ndescriptors:\n  - key: api_key\n    concurrency: {slots: 5, lease: 60s}\n  - key: path\n    rate_limit: {unit: hour, requests_per_unit: 1}\n"))
	if err != nil {
		t.Fatal(err)
	}
	d := c.Domains["api"]
	if !d.HasConcurrency {
		t.Fatal("HasConcurrency is false")
	}
	if n := d.LookupSlots([]Entry{{"api_key", "k"}}); n == nil || n.Concurrency.Slots != 5 || n.Concurrency.Lease != time.Minute {
		t.Fatalf("LookupSlots: %+v", n)
	}
	if n := d.LookupSlots([]Entry{{"path", "/"}}); n != nil {
		t.Fatalf("a rate descriptor is a concurrency one: %+v", n)
	}
	if m := d.Lookup([]Entry{{"api_key", "k"}}); m.Limit != nil {
		t.Fatalf("a concurrency descriptor has a rate limit: %+v", m)
	}
	for _, tc := range []struct{ yaml, want string }{
		{"  - key: a\n    concurrency: {slots: 0, lease: 1s}\n", "descriptors[0].concurrency.slots: must be from 1"},
		{"  - key: a\n    concurrency: {slots: 1}\n", "descriptors[0].concurrency.lease: missing"},
		{"  - key: a\n    concurrency: {slots: 1, lease: 1s, burst: 2}\n", "descriptors[0].concurrency.burst: unknown field"},
		{"  - key: a\n    concurrency: {slots: 1, lease: 1s}\n    rate_limit: {unit: hour, requests_per_unit: 1}\n", "not both"},
	} {
		_, err := Parse("api.yaml", []byte("domain: api\ndescriptors:\n"+tc.yaml))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want %q", tc.yaml, err, tc.want)
		}
	}
}
