package resp

import (
	"bufio"
	"context"
	"io"
	"log/slog"
	"net"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/floodgate/floodgate"
	"github.com/floodgate/floodgate/core"
	"github.com/floodgate/floodgate/internal/server/config"
	"github.com/floodgate/floodgate/internal/server/service"
	"github.com/floodgate/floodgate/internal/testkit/nettest"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// listening starts a Server over store with o on a loopback port, and
// shuts it down when t ends.
func listening(t *testing.T, store floodgate.Store, o *Options) (*Server, string) {
	t.Helper()
	if store == nil {
		st := floodgate.NewMemoryStore(&floodgate.MemoryOptions{SweepInterval: -1})
		t.Cleanup(func() { st.Close() })
		store = st
	}
	svc, err := service.New(store, config.Example(), &service.Options{Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	srv := New(svc, o)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		srv.Serve(ln)
	}()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		srv.Shutdown(ctx)
		<-done
	})
	return srv, ln.Addr().String()
}

func dial(t *testing.T, addr string) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	c.SetDeadline(time.Now().Add(10 * time.Second)) // no test waits longer
	t.Cleanup(func() { c.Close() })
	return c
}

// roundTrip sends cmds and reads one reply line per command.
func roundTrip(t *testing.T, c net.Conn, r *bufio.Reader, cmds ...string) []string {
	t.Helper()
	io.WriteString(c, strings.Join(cmds, "\r\n")+"\r\n")
	var out []string
	for range cmds {
		line, err := r.ReadString('\n')
		if err != nil {
			t.Fatalf("after %q: %v", out, err)
		}
		out = append(out, strings.TrimSpace(line))
	}
	return out
}

// A connection that does not authenticate is closed after AuthTimeout of
// silence; an authenticated one is not.
func TestUnauthenticatedIdle(t *testing.T) {
	_, addr := listening(t, nil, &Options{Token: "t", AuthTimeout: 100 * time.Millisecond})
	idle := dial(t, addr)
	authed := dial(t, addr)
	ar := bufio.NewReader(authed)
	roundTrip(t, authed, ar, "AUTH t")
	if _, err := idle.Read(make([]byte, 1)); err != io.EOF {
		t.Fatalf("idle unauthenticated connection: read %v, want EOF", err)
	}
	if got := roundTrip(t, authed, ar, "PING"); got[0] != "+PONG" {
		t.Fatalf("authenticated connection: %v", got)
	}
}

// Connections that never authenticate cannot keep out one that does:
// past MaxUnauthenticated, or at MaxConns, the oldest waiting one goes.
func TestUnauthenticatedCannotExhaust(t *testing.T) {
	_, addr := listening(t, nil, &Options{Token: "t", MaxConns: 20, MaxUnauthenticated: 5})
	for range 40 {
		dial(t, addr)
	}
	c := dial(t, addr)
	if got := roundTrip(t, c, bufio.NewReader(c), "AUTH t", "PING"); got[0] != "+OK" || got[1] != "+PONG" {
		t.Fatalf("a real client after 40 idle connections: %v", got)
	}
}

// Without a token too, idle connections cannot fill the cap: at it, a
// new connection closes the one idle the longest.
func TestIdleCannotExhaust(t *testing.T) {
	_, addr := listening(t, nil, &Options{MaxConns: 10, EvictIdleAfter: time.Nanosecond})
	for range 30 {
		dial(t, addr)
	}
	c := dial(t, addr)
	if got := roundTrip(t, c, bufio.NewReader(c), "PING"); got[0] != "+PONG" {
		t.Fatalf("a client after 30 idle connections: %v", got)
	}
}

// Wrong passwords are counted, close the connection after a few, and are
// logged at most once a second.
func TestAuthGuessing(t *testing.T) {
	var lines atomic.Int64
	log := slog.New(countHandler{&lines})
	srv, addr := listening(t, nil, &Options{Token: "t", Logger: log})
	for range 20 {
		c := dial(t, addr)
		r := bufio.NewReader(c)
		got := roundTrip(t, c, r, "AUTH a", "AUTH b", "AUTH c")
		for _, g := range got {
			if !strings.HasPrefix(g, "-WRONGPASS") {
				t.Fatalf("wrong password answered %q", g)
			}
		}
		io.WriteString(c, "AUTH t\r\n")
		if line, err := r.ReadString('\n'); err == nil {
			t.Fatalf("after three wrong passwords the connection is open: %q", line)
		}
	}
	if n := srv.authFailures.Get(); n != 60 {
		t.Errorf("failures counted: %d, want 60", n)
	}
	if n := lines.Load(); n < 1 || n > 3 {
		t.Errorf("%d log lines for 60 failures in well under 3s, want 1 to 3", n)
	}
}

type countHandler struct{ n *atomic.Int64 }

func (h countHandler) Enabled(context.Context, slog.Level) bool  { return true }
func (h countHandler) Handle(context.Context, slog.Record) error { h.n.Add(1); return nil }
func (h countHandler) WithAttrs([]slog.Attr) slog.Handler        { return h }
func (h countHandler) WithGroup(string) slog.Handler             { return h }

// A client that pipelines and never reads holds a goroutine only until
// the write deadline, and Shutdown ends it at once.
func TestClientThatNeverReads(t *testing.T) {
	srv, addr := listening(t, nil, &Options{WriteTimeout: time.Hour})
	c := dial(t, addr)
	nettest.FillUntilBlocked(t, c)
	start := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	srv.Shutdown(ctx)
	if d := time.Since(start); d > 900*time.Millisecond {
		t.Errorf("Shutdown took %s with a client that does not read", d)
	}
}

// hanging is a store whose decisions wait for their context; each says
// on entered that it has started.
type hanging struct {
	core.Store  // nil: the tests call only the methods below
	core.Policy // nil: the tests call only the methods below
	entered     chan struct{}
}

func (h hanging) Prepare([]core.Spec) (core.Policy, error) { return h, nil }
func (hanging) Close() error                               { return nil }
func (hanging) Reset(context.Context, string) error        { return nil }
func (h hanging) Take(ctx context.Context, _ string, _ int64) (core.Decision, error) {
	h.entered <- struct{}{}
	<-ctx.Done()
	return core.Decision{}, ctx.Err()
}

// A command waiting for the store ends when the server stops.
func TestShutdownEndsCommands(t *testing.T) {
	h := hanging{entered: make(chan struct{}, 1)}
	srv, addr := listening(t, h, &Options{})
	c := dial(t, addr)
	io.WriteString(c, "FG.CHECK example k\r\n")
	<-h.entered
	start := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	if err := srv.Shutdown(ctx); err != nil {
		t.Errorf("Shutdown: %v", err)
	}
	if d := time.Since(start); d > 900*time.Millisecond {
		t.Errorf("Shutdown took %s with a command waiting for the store", d)
	}
}
