package main

import (
	"bytes"
	"context"
	"strings"
	"testing"
)

// floodgate check --server refuses a RULE or KEY that is not UTF-8, as the
// server does, before it sends anything: JSON would carry U+FFFD instead.
func TestCheckRemoteInvalidUTF8(t *testing.T) {
	tests := []struct {
		name      string
		rule, key string
		wantInErr string
	}{
		{"key 0xff", "api", "x\xffy", `KEY "x\xffy" is not valid UTF-8`},
		{"key 0xfe", "api", "x\xfey", `KEY "x\xfey" is not valid UTF-8`},
		{"rule", "a\xc3", "k", `RULE "a\xc3" is not valid UTF-8`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			// Port 1 of loopback: nothing is sent there.
			code := checkCmd(context.Background(), []string{"--server", "http://127.0.0.1:1", tt.rule, tt.key}, &stdout, &stderr)
			if code != 2 || !strings.Contains(stderr.String(), tt.wantInErr) || stdout.Len() != 0 {
				t.Errorf("exit %d, stderr %q, stdout %q; want 2 and %q", code, stderr.String(), stdout.String(), tt.wantInErr)
			}
		})
	}
}
