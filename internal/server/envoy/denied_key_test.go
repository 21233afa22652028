package envoy

import (
	"strings"
	"testing"
	"unicode/utf8"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"

	"github.com/floodgate/floodgate"
)

// TestDeniedKey: a denied descriptor's name in the top keys is its
// entries, cut to floodgate.MaxKeyLen bytes of valid UTF-8, however long
// the request's values.
func TestDeniedKey(t *testing.T) {
	e := func(kv ...string) []*rlcommon.RateLimitDescriptor_Entry {
		var out []*rlcommon.RateLimitDescriptor_Entry
		for i := 0; i < len(kv); i += 2 {
			out = append(out, &rlcommon.RateLimitDescriptor_Entry{Key: kv[i], Value: kv[i+1]})
		}
		return out
	}
	long := strings.Repeat("é", floodgate.MaxKeyLen)
	for _, tc := range []struct {
		name    string
		entries []*rlcommon.RateLimitDescriptor_Entry
		want    string // "" checks the bound only
	}{
		{"one", e("ip", "1.2.3.4"), "ip=1.2.3.4"},
		{"two", e("ip", "1.2.3.4", "path", "/x"), "ip=1.2.3.4,path=/x"},
		{"no value", e("generic_key", ""), "generic_key="},
		{"long value", e("path", long), ""},
		{"many entries", e(strings.Split(strings.Repeat("k,v,", floodgate.MaxKeyLen), ",")[:2*floodgate.MaxKeyLen]...), ""},
	} {
		got := deniedKey(tc.entries)
		if tc.want != "" && got != tc.want {
			t.Errorf("%s: %q, want %q", tc.name, got, tc.want)
		}
		if len(got) > floodgate.MaxKeyLen || !utf8.ValidString(got) {
			t.Errorf("%s: %d bytes (valid UTF-8: %v), want at most %d", tc.name, len(got), utf8.ValidString(got), floodgate.MaxKeyLen)
		}
	}
}
