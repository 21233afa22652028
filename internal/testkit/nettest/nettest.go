// Package nettest holds helpers for tests of floodgate's network servers.
package nettest

import (
	"bufio"
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

// TCPLines listens on a free loopback port, as a StatsD server over TCP
// does, and sends each line of the first connection it accepts to lines,
// which buffers n of them. It stops listening when t ends. It returns
// the port.
func TCPLines(t testing.TB, n int) (port string, lines <-chan string) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	ch := make(chan string, n)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		sc := bufio.NewScanner(c)
		for sc.Scan() {
			ch <- sc.Text()
		}
	}()
	_, port, _ = net.SplitHostPort(ln.Addr().String())
	return port, ch
}
