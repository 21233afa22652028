// Package nettest holds helpers for tests of floodgate's network servers.
package nettest

import (
	"io"
	"net"
	"strings"
	"testing"
	"time"
)

// FillUntilBlocked pipelines Redis-protocol ECHO commands of 8 KB on c,
// never reading the replies, until the server stops reading too: its
// replies have filled both socket buffers and its own write is blocked.
// It fails t if the server never stops reading (after 64 MB).
func FillUntilBlocked(t testing.TB, c net.Conn) {
	t.Helper()
	cmd := "ECHO " + strings.Repeat("x", 8000) + "\r\n"
	for range 8000 {
		c.SetWriteDeadline(time.Now().Add(100 * time.Millisecond))
		if _, err := io.WriteString(c, cmd); err != nil {
			c.SetWriteDeadline(time.Time{})
			return
		}
	}
	t.Fatal("the server kept reading a client that never reads")
}
