package resp

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"strings"
	"testing"

	"github.com/floodgate/floodgate"
	"github.com/floodgate/floodgate/internal/server/config"
	"github.com/floodgate/floodgate/internal/server/service"
	"github.com/floodgate/floodgate/storetest"
)

// run feeds input to one connection's command loop and returns what it
// wrote back.
func run(t testing.TB, token, input string) string {
	// A fixed clock: a reply that says how long to wait (TestSettleDebt's)
	// is then the same however long the commands take to run.
	store := floodgate.NewMemoryStore(&floodgate.MemoryOptions{SweepInterval: -1, Clock: storetest.NewClock(storetest.Base)})
	defer store.Close()
	svc, err := service.New(store, config.Example(), &service.Options{Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	c := &conn{s: New(svc, &Options{Token: token, Version: "test", Logger: slog.New(slog.DiscardHandler)}), c: stubConn{}, ctx: context.Background(),
		r: bufio.NewReader(strings.NewReader(input)), w: bufio.NewWriter(&out), proto: 2, authed: token == ""}
	for range 10000 { // bounded: every iteration consumes input or ends
		args, err := c.readCommand()
		if err != nil {
			var pe protocolError
			if e, ok := err.(protocolError); ok {
				pe = e
				c.writeError("ERR Protocol error: " + string(pe))
			}
			break
		}
		if len(args) > 0 && !c.dispatch(args) {
			break
		}
	}
	c.w.Flush()
	return out.String()
}

// stubConn stands in for the network connection of a conn fed from a
// string: only its address is read.
type stubConn struct{ net.Conn }

func (stubConn) RemoteAddr() net.Addr { return &net.TCPAddr{IP: net.IPv4(192, 0, 2, 1), Port: 1} }

func TestCommands(t *testing.T) {
	tests := []struct {
		token, in, want string
	}{
		{"", "*1\r\n$4\r\nPING\r\n", "+PONG\r\n"},
		{"", "PING\r\nPING hello\r\n", "+PONG\r\n$5\r\nhello\r\n"},
		{"", "*5\r\n$11\r\nCL.THROTTLE\r\n$7\r\nuser123\r\n$2\r\n15\r\n$2\r\n30\r\n$2\r\n60\r\n", "*5\r\n:0\r\n:16\r\n:15\r\n:-1\r\n:2\r\n"},
		{"", "HELLO 3\r\n", "%7\r\n$6\r\nserver\r\n$9\r\nfloodgate\r\n"},
		{"", "HELLO 4\r\n", "-NOPROTO unsupported protocol version\r\n"},
		{"", "HELLO 2\r\n", "*14\r\n"},
		{"", "QUIT\r\nPING\r\n", "+OK\r\n"},
		{"", "*-1\r\n*0\r\nPING\r\n", "+PONG\r\n"},
		{"tok", "PING\r\nAUTH nope\r\nAUTH tok\r\nPING\r\n", "-NOAUTH Authentication required.\r\n-WRONGPASS invalid username-password pair or user is disabled.\r\n+OK\r\n+PONG\r\n"},
		{"tok", "HELLO 3 AUTH default tok\r\n", "%7\r\n"},
		{"", "AUTH x\r\n", "-ERR AUTH called without any password configured"},
		{"", "COMMAND COUNT\r\nCOMMAND DOCS\r\nCLIENT SETINFO lib-name x\r\n", ":18\r\n*0\r\n+OK\r\n"},
		// A check charged 15, the request cost 5: 10 come back (the
		// example rule: burst 20).
		{"", "FG.CHECK example k 15\r\nFG.SETTLE example k 15 5\r\n", "*5\r\n:0\r\n:20\r\n:5\r\n:-1\r\n"},
		{"", "FG.SETTLE example k 0 25\r\nFG.CHECK example k\r\n", "*5\r\n:0\r\n:20\r\n:0\r\n:-1\r\n"},
		{"", "FG.SETTLE example k 1 -1\r\n", "-ERR bad request: charged and cost must not be negative"},
		{"", "FG.SETTLE example k 1\r\n", "-ERR wrong number of arguments"},
		{"", "FG.SETTLE nope k 1 2\r\n", "-ERR unknown rule"},
		{"", "*2\r\n$3\r\nGET\r\n$1\r\nab\r\n", "-ERR Protocol error: bulk string not terminated by CRLF\r\n"},
	}
	for _, tt := range tests {
		if got := run(t, tt.token, tt.in); !strings.HasPrefix(got, tt.want) {
			t.Errorf("%q:\n got %q\nwant %q", tt.in, got, tt.want)
		}
	}
}

// FuzzConn feeds arbitrary bytes to a connection: it must never panic, and
// every reply must be well-formed RESP.
func FuzzConn(f *testing.F) {
	for _, s := range []string{
		"*1\r\n$4\r\nPING\r\n", "*3\r\n$8\r\nFG.CHECK\r\n$7\r\nexample\r\n$1\r\nk\r\n",
		"CL.THROTTLE a 1 2 3 4\r\n", "HELLO 3 AUTH a b SETNAME c\r\n", "*2\r\n$-5\r\n", "*9999999999999999999\r\n",
		"$\r\n", "*1\r\n$0\r\n\r\n", "CL.THROTTLE k -1 -1 -1 -1\r\n", "FG.CHECK example k 99999999999999\r\n", "FG.EXPLAIN example k JSON\r\n",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, in string) {
		out := run(t, "", in)
		r := bufio.NewReader(strings.NewReader(out))
		for {
			if err := readReply(r); err == io.EOF {
				return
			} else if err != nil {
				t.Fatalf("malformed reply to %q: %v\n%q", in, err, out)
			}
		}
	})
}

// readReply reads one RESP2/RESP3 reply of the kinds the server writes.
func readReply(r *bufio.Reader) error {
	line, err := r.ReadString('\n')
	if err != nil {
		if err == io.EOF && line == "" {
			return io.EOF
		}
		return err
	}
	if !strings.HasSuffix(line, "\r\n") || len(line) < 3 {
		return io.ErrUnexpectedEOF
	}
	body := line[1 : len(line)-2]
	switch line[0] {
	case '+', '-', ':':
		return nil
	case '$':
		var n int
		if _, err := fmt.Sscan(body, &n); err != nil {
			return err
		}
		_, err := io.ReadFull(r, make([]byte, n+2))
		return err
	case '*', '%':
		var n int
		if _, err := fmt.Sscan(body, &n); err != nil {
			return err
		}
		if line[0] == '%' {
			n *= 2
		}
		for range n {
			if err := readReply(r); err != nil {
				return err
			}
		}
		return nil
	}
	return io.ErrUnexpectedEOF
}

// TestSettleDebt: a settle that charges more than the bucket holds takes
// the key into debt, and the next check waits.
func TestSettleDebt(t *testing.T) {
	got := run(t, "", "FG.SETTLE example k 0 25\r\nFG.CHECK example k\r\n")
	// The settle's reply, then a limited check (10/s, burst 20, 5 in debt:
	// the next unit in 600ms).
	if !strings.HasPrefix(got, "*5\r\n:0\r\n:20\r\n:0\r\n:-1\r\n") || !strings.Contains(got, "*5\r\n:1\r\n:20\r\n:0\r\n:600\r\n") {
		t.Errorf("got %q", got)
	}
}
