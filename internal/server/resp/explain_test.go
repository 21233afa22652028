package resp

import (
	"strings"
	"testing"
)

func TestExplain(t *testing.T) {
	tests := []struct {
		in, want string
	}{
		{"FG.EXPLAIN example k\r\n", "*4\r\n$50\r\nkey \"k\" is checked against rule \"example\": 1 limit\r\n"},
		{"FG.CHECK example k 20\r\nFG.EXPLAIN example k\r\n", "a check of cost 1 would be denied by limit 0, which admits 1 again within 2s\r\n"},
		{"FG.EXPLAIN example k json\r\n", "$"},
		{"FG.EXPLAIN example k JSON\r\n", `{"rule":"example","key":"k","shadow":false,"limits":[{"index":0,"name":"example","algorithm":"token-bucket",`},
		{"FG.EXPLAIN example k XML\r\n", "-ERR syntax error: the only option of FG.EXPLAIN is JSON\r\n"},
		{"FG.EXPLAIN example\r\n", "-ERR wrong number of arguments for 'fg.explain' command\r\n"},
		{"FG.EXPLAIN nope k\r\n", "-ERR unknown rule \"nope\"\r\n"},
		{"*3\r\n$10\r\nFG.EXPLAIN\r\n$0\r\n\r\n$1\r\nk\r\n", "-ERR bad request: rule is required\r\n"},
		{"FG.EXPLAIN example " + strings.Repeat("k", 513) + "\r\n", "-ERR bad request: key is 513 bytes, more than the maximum 512\r\n"},
	}
	for _, tt := range tests {
		if got := run(t, "", tt.in); !strings.Contains(got, tt.want) {
			t.Errorf("%.60q:\n got %q\nwant it to hold %q", tt.in, got, tt.want)
		}
	}
	// Behind AUTH like every command.
	if got := run(t, "tok", "FG.EXPLAIN example k\r\n"); !strings.HasPrefix(got, "-NOAUTH") {
		t.Errorf("without AUTH: %q", got)
	}
}
