package config

import (
	"testing"
)

// TestSyntaxErrorPosition: a YAML syntax error names the line and column
// of the problem, not the line before it (the yaml library gives the
// 0-based line where the construct around the problem began).
func TestSyntaxErrorPosition(t *testing.T) {
	for _, tc := range []struct {
		name, yaml, want string
	}{
		{"over-indented key", "rules:\n  - name: a\n   rate: 1\n", "f.yaml:3:4: did not find expected '-' indicator"},
		{"key under a sequence", "rules:\n  - name: a\n    rate: 1\n  burst: 2\n", "f.yaml:4:8: did not find expected '-' indicator"},
		{"two colons", "rules:\n  - name: a\n    rate: 1: 2\n", "f.yaml:3:12: mapping values are not allowed in this context"},
		{"indented key", "rules: []\nx: 1\n  y: 2\n", "f.yaml:3:4: mapping values are not allowed in this context"},
		{"tab", "rules:\n\t- name: a\n", "f.yaml:2:1: found character that cannot start any token"},
		{"unclosed flow", "rules:\n  - name: [a\n    rate: 1\n", "f.yaml:2:12: did not find expected ',' or ']'"},
		{"unclosed quote", "rules:\n  - name: 'a\n", "f.yaml:3:1: found unexpected end of stream"},
		{"unknown alias", "rules:\n  - name: *x\n", "f.yaml:2:12: unknown anchor 'x' referenced"},
		{"error on line 1", "rules: 1\nx: 1: 2\n", "f.yaml:2:5: mapping values are not allowed in this context"},
		{"no newline at the end", "rules:\n  - name: \"a", "f.yaml:2:13: found unexpected end of stream"},
		{"not ASCII", "rules:\n  - name: é: b: c\n", "f.yaml:2:12: mapping values are not allowed in this context"},
	} {
		_, err := Parse("f.yaml", []byte(tc.yaml))
		if err == nil || err.Error() != tc.want {
			t.Errorf("%s: %v, want %s", tc.name, err, tc.want)
		}
	}
	if _, err := ParseOverride("o.yaml", []byte("rate: 1\n burst: 2\n")); err == nil || err.Error() != "o.yaml:2:7: mapping values are not allowed in this context" {
		t.Errorf("override: %v", err)
	}
}
