package config

import (
	"strings"
	"testing"
)

// Trace follows Lookup: the steps it reports end where Lookup's walk
// does, on the node whose limit Lookup found.
func TestTrace(t *testing.T) {
	c, err := Parse("example.yaml", []byte(envoyExample))
	if err != nil {
		t.Fatal(err)
	}
	d := c.Domains["example"]
	tests := []struct {
		entries []Entry
		steps   string // each step's By, and "/" when it matched no node
		limit   bool
	}{
		{[]Entry{{"database", "users"}}, "value", true},
		{[]Entry{{"database", "other"}}, "/", false},
		{[]Entry{{"remote_address", "10.0.0.1"}}, "key", true},
		{[]Entry{{"message_type", "marketing"}, {"to_number", "2061234567"}}, "value key", true},
		{[]Entry{{"message_type", "marketing"}}, "value", false},
		{[]Entry{{"remote_address", "a"}, {"extra", "b"}}, "key", false},
		{[]Entry{{"key1", "value1"}}, "wildcard", true},
		{[]Entry{{"files", "/api/a"}}, "wildcard", true},
		{[]Entry{{"message_type", "marketing"}, {"to_number", "1"}, {"x", "y"}}, "value key", false},
		{[]Entry{{"message_type", "transactional"}, {"to_number", "2"}}, "/", false},
		{[]Entry{}, "", false},
	}
	for _, tt := range tests {
		steps, m := d.Trace(tt.entries)
		var got []string
		for _, s := range steps {
			if s.Node == nil {
				got = append(got, "/")
			} else {
				got = append(got, s.By)
			}
		}
		if strings.Join(got, " ") != tt.steps || (m.Limit != nil) != tt.limit {
			t.Errorf("%v: steps %q, limit %v; want %q, %v", tt.entries, strings.Join(got, " "), m.Limit != nil, tt.steps, tt.limit)
		}
		if m.Limit != nil && (len(steps) != len(tt.entries) || steps[len(steps)-1].Node != m.Node) {
			t.Errorf("%v: the last step's node is not Lookup's", tt.entries)
		}
		if len(steps) > 0 && steps[0].By == "wildcard" && steps[0].Wildcard == "" {
			t.Errorf("%v: a wildcard step without its wildcard", tt.entries)
		}
	}
}
