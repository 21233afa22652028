package config

import (
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"
)

// TestParseEnvoyNode: a built YAML tree is read and validated as a domain
// file is, its errors name the source without a position.
func TestParseEnvoyNode(t *testing.T) {
	parse := func(s string) *yaml.Node {
		var doc yaml.Node
		if err := yaml.Unmarshal([]byte(s), &doc); err != nil {
			t.Fatal(err)
		}
		return doc.Content[0]
	}
	d, err := ParseEnvoyNode("src", parse("domain: api\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 2}\n"))
	if err != nil || d.Name != "api" || d.File != "src" || d.Root.Children["k"].Limit.RequestsPerUnit != 2 {
		t.Fatalf("%+v, %v", d, err)
	}
	for _, tc := range []struct {
		root *yaml.Node
		want string
	}{
		{nil, "src: domain: config file cannot have empty domain"},
		{parse("descriptors: []\n"), "src: domain: config file cannot have empty domain"},
		{parse("[1, 2]\n"), "src: domain: config file cannot have empty domain"},
		{&yaml.Node{Kind: yaml.MappingNode, Content: []*yaml.Node{
			{Kind: yaml.ScalarNode, Value: "domain"}, {Kind: yaml.ScalarNode, Value: "api"},
			{Kind: yaml.ScalarNode, Value: "descriptors"}, {Kind: yaml.SequenceNode, Content: []*yaml.Node{{Kind: yaml.MappingNode}}},
		}}, "src: descriptors[0].key: descriptor has empty key"},
	} {
		if _, err := ParseEnvoyNode("src", tc.root); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("got %v, want %q", err, tc.want)
		}
	}
}

// TestFromDomains joins domains as a directory's files are joined.
func TestFromDomains(t *testing.T) {
	dom := func(src, yml string) *Domain {
		c, err := Parse(src, []byte(yml))
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range c.Domains {
			return d
		}
		return nil
	}
	a := func() *Domain {
		return dom("a", "domain: api\ndescriptors:\n  - key: x\n    rate_limit: {unit: second, requests_per_unit: 1}\n")
	}
	b := func() *Domain {
		return dom("b", "domain: api\ndescriptors:\n  - key: y\n    rate_limit: {unit: second, requests_per_unit: 1}\n")
	}
	if _, err := FromDomains("s", []*Domain{a(), b()}, false); err == nil || !strings.Contains(err.Error(), "b:1:1: domain: duplicate domain 'api' in config file (also in a)") {
		t.Fatalf("without merge: %v", err)
	}
	c, err := FromDomains("s", []*Domain{a(), b()}, true)
	if err != nil || c.Source != "s" || len(c.Domains["api"].Root.Children) != 2 || len(c.Rules) != 0 {
		t.Fatalf("merged: %+v, %v", c, err)
	}
	if c, err := FromDomains("s", nil, false); err != nil || len(c.Domains) != 0 {
		t.Fatalf("none: %+v, %v", c, err)
	}
	if _, ok := c.Rule("anything"); ok {
		t.Fatal("a rule in a configuration of domains")
	}
	if _, err := FromDomains("s", []*Domain{nil}, false); err == nil {
		t.Fatal("a nil domain accepted")
	}
}
