// Package resp serves floodgate over the Redis protocol (RESP2, and RESP3
// after HELLO 3), so that any Redis client can call it:
//
//	CL.THROTTLE <key> <max_burst> <count> <period_seconds> [<quantity>]
//	    redis-cell's command, with exactly its reply: limited (0/1), limit,
//	    remaining, retry_after and reset_after in seconds (rounded up;
//	    retry_after -1 when allowed or never allowable).
//	FG.CHECK <rule> <key> [<cost>]
//	    a configured rule: limited (0/1; always 0 for a shadow rule),
//	    limit, remaining, retry_after_ms (-1 when allowed or never),
//	    reset_after_ms.
//	FG.SETTLE <rule> <key> <charged> <cost>
//	    corrects a check that charged charged to the real cost: refunds or
//	    charges the difference (even into debt); replies as FG.CHECK, with
//	    the state after.
//	FG.OVERRIDE SET <rule> <key> <override> | GET <rule> <key> |
//	    DEL <rule> <key> [<strategy>] | LIST [<rule>]
//	    a key's own limits (see override's documentation)
//	FG.RESET <rule> <key>, FG.RULES
//	PING, ECHO, HELLO, AUTH, QUIT, SELECT 0, COMMAND, CLIENT
//
// Frames are bounded (MaxArgs arguments, MaxBulk bytes each, MaxInline
// bytes for an inline command). A malformed frame gets a RESP error and
// the connection is closed; other connections are unaffected.
//
// Abusive clients: with a token, a connection that has not authenticated
// is closed after AuthTimeout of silence, after MaxAuthFailures wrong
// passwords, or to make room when MaxUnauthenticated connections wait to
// authenticate (the oldest goes), so connections that never authenticate
// cannot take the slots of those that do. Wrong passwords are counted in
// floodgate_resp_auth_failures_total and logged at most once a second.
// Every write has a deadline, and every command runs on a context that
// ends when the server stops.
package resp

import (
	"bufio"
	"context"
	"crypto/subtle"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/floodgate/floodgate"
	"github.com/floodgate/floodgate/internal/arith"
	"github.com/floodgate/floodgate/internal/lib/lograte"
	"github.com/floodgate/floodgate/internal/server/config"
	"github.com/floodgate/floodgate/internal/server/metrics"
	"github.com/floodgate/floodgate/internal/server/service"
)

// The bounds on what a client may send.
const (
	MaxArgs   = 64
	MaxBulk   = 8 << 10
	MaxInline = 8 << 10
)

// Server serves the Redis protocol. Make one with New.
type Server struct {
	svc     *service.Service
	token   string
	version string
	log     *slog.Logger
	o       Options

	ctx    context.Context // ends when the server stops; commands run on it
	cancel context.CancelFunc

	mu      sync.Mutex
	ln      net.Listener
	conns   map[net.Conn]*conn
	unauth  []*conn // connections waiting to authenticate, oldest first
	closing bool
	wg      sync.WaitGroup
	nextID  int64

	authFailures *metrics.CounterVec
	authLog      *lograte.Limiter // one line a second of wrong passwords
}

// Options configures a Server. The zero value (or nil) gives the
// defaults.
type Options struct {
	// Token, when set, must be given with AUTH (any user name) before
	// other commands.
	Token string
	// Version is what HELLO reports as the server's version.
	Version string
	// Logger receives connection and store errors. Default: slog.Default().
	Logger *slog.Logger
	// MaxConns is the most open connections. Default: 10,000.
	MaxConns int
	// MaxUnauthenticated is the most connections waiting to authenticate
	// (with a Token); a new one beyond it closes the oldest. Default: 1,000.
	MaxUnauthenticated int
	// IdleTimeout closes an authenticated connection that sends nothing
	// for this long. Default: 5 minutes.
	IdleTimeout time.Duration
	// AuthTimeout closes a connection that has not authenticated (with a
	// Token) and sends nothing for this long. Default: 10 seconds.
	AuthTimeout time.Duration
	// WriteTimeout is the longest a write may wait for a client that does
	// not read. Default: 10 seconds.
	WriteTimeout time.Duration
	// MaxAuthFailures wrong passwords close a connection. Default: 3.
	MaxAuthFailures int
	// EvictIdleAfter: at MaxConns, a new connection closes the one idle the
	// longest if it has sent nothing for this long, so that idle
	// connections cannot keep out working clients, with a token or
	// without. Default: 1 second.
	EvictIdleAfter time.Duration
}

// New returns a Server over svc.
func New(svc *service.Service, opts *Options) *Server {
	var o Options
	if opts != nil {
		o = *opts
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	if o.MaxConns <= 0 {
		o.MaxConns = 10000
	}
	if o.MaxUnauthenticated <= 0 {
		o.MaxUnauthenticated = 1000
	}
	if o.IdleTimeout <= 0 {
		o.IdleTimeout = 5 * time.Minute
	}
	if o.AuthTimeout <= 0 {
		o.AuthTimeout = 10 * time.Second
	}
	if o.WriteTimeout <= 0 {
		o.WriteTimeout = 10 * time.Second
	}
	if o.MaxAuthFailures <= 0 {
		o.MaxAuthFailures = 3
	}
	if o.EvictIdleAfter <= 0 {
		o.EvictIdleAfter = time.Second
	}
	s := &Server{svc: svc, token: o.Token, version: o.Version, log: o.Logger, o: o, conns: map[net.Conn]*conn{},
		authLog: lograte.New(time.Second, nil)}
	s.ctx, s.cancel = context.WithCancel(context.Background())
	s.authFailures = svc.Metrics.NewCounterVec("floodgate_resp_auth_failures_total", "Wrong passwords given to AUTH or HELLO on the Redis protocol.")
	svc.Metrics.NewGaugeFunc("floodgate_resp_connections", "Open Redis protocol connections.", func() float64 {
		s.mu.Lock()
		defer s.mu.Unlock()
		return float64(len(s.conns))
	})
	return s
}

// Serve accepts connections on ln until Shutdown. It returns nil after
// Shutdown, and the accept error otherwise.
func (s *Server) Serve(ln net.Listener) error {
	s.mu.Lock()
	if s.closing {
		s.mu.Unlock()
		ln.Close()
		return nil
	}
	s.ln = ln
	s.mu.Unlock()
	for {
		c, err := ln.Accept()
		if err != nil {
			s.mu.Lock()
			closing := s.closing
			s.mu.Unlock()
			if closing {
				return nil
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				continue
			}
			return err
		}
		s.mu.Lock()
		if !s.closing && s.token != "" && (len(s.unauth) >= s.o.MaxUnauthenticated || len(s.conns) >= s.o.MaxConns) && len(s.unauth) > 0 {
			// Connections that have not authenticated never keep out one
			// that may: the oldest of them makes room.
			s.unauth[0].c.Close()
			s.unauth = s.unauth[1:]
		} else if !s.closing && len(s.conns) >= s.o.MaxConns && s.closeIdlest() {
			// At the cap, a connection idle for a while makes room, so
			// that idle connections cannot keep out a working client.
		} else if s.closing || len(s.conns) >= s.o.MaxConns {
			s.mu.Unlock()
			c.SetWriteDeadline(time.Now().Add(time.Second))
			c.Write([]byte("-ERR max number of clients reached\r\n"))
			c.Close()
			continue
		}
		s.nextID++
		cc := s.newConn(c, s.nextID)
		s.conns[c] = cc
		if !cc.authed {
			s.unauth = append(s.unauth, cc)
		}
		s.wg.Add(1)
		s.mu.Unlock()
		go s.serveConn(cc)
	}
}

// closeIdlest closes the connection idle the longest, if it has been idle
// for EvictIdleAfter, and reports whether it did. s.mu is held.
func (s *Server) closeIdlest() bool {
	var idlest *conn
	for _, c := range s.conns {
		if idlest == nil || c.active.Load() < idlest.active.Load() {
			idlest = c
		}
	}
	if idlest == nil || time.Since(time.Unix(0, idlest.active.Load())) < s.o.EvictIdleAfter {
		return false
	}
	idlest.c.Close()
	idlest.active.Store(time.Now().UnixNano()) // not picked again while it closes
	return true
}

// authenticated moves c out of the connections waiting to authenticate.
func (s *Server) authenticated(c *conn) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for i, u := range s.unauth {
		if u == c {
			s.unauth = append(s.unauth[:i], s.unauth[i+1:]...)
			return
		}
	}
}

// Shutdown stops accepting, lets each connection finish the command it
// is running, closes them, and waits for them or for ctx.
func (s *Server) Shutdown(ctx context.Context) error {
	s.mu.Lock()
	s.closing = true
	if s.ln != nil {
		s.ln.Close()
	}
	s.cancel() // commands in flight end
	for c := range s.conns {
		// Wakes a connection waiting for its next command; one running a
		// command writes its reply, within a short grace for a client that
		// does not read, and then sees closing.
		c.SetReadDeadline(time.Now())
		c.SetWriteDeadline(time.Now().Add(100 * time.Millisecond))
	}
	s.mu.Unlock()
	done := make(chan struct{})
	go func() { s.wg.Wait(); close(done) }()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		s.mu.Lock()
		for c := range s.conns {
			c.Close()
		}
		s.mu.Unlock()
		<-done
		return ctx.Err()
	}
}

type conn struct {
	s        *Server
	c        net.Conn
	ctx      context.Context // the server's: ends when it stops
	r        *bufio.Reader
	w        *bufio.Writer
	id       int64
	proto    int
	authed   bool
	failures int          // wrong passwords on this connection
	active   atomic.Int64 // unix ns of its last command, or of its start
}

// deadlineWriter gives every write to a connection a deadline, so that a
// client that does not read cannot hold a goroutine forever.
type deadlineWriter struct {
	c       net.Conn
	timeout time.Duration
}

func (w deadlineWriter) Write(p []byte) (int, error) {
	w.c.SetWriteDeadline(time.Now().Add(w.timeout))
	return w.c.Write(p)
}

func (s *Server) newConn(nc net.Conn, id int64) *conn {
	c := &conn{s: s, c: nc, ctx: s.ctx, r: bufio.NewReaderSize(nc, 16<<10),
		w: bufio.NewWriterSize(deadlineWriter{nc, s.o.WriteTimeout}, 16<<10), id: id, proto: 2, authed: s.token == ""}
	c.active.Store(time.Now().UnixNano())
	return c
}

func (s *Server) serveConn(c *conn) {
	nc := c.c
	defer s.wg.Done()
	defer func() {
		s.mu.Lock()
		delete(s.conns, nc)
		s.mu.Unlock()
		if !c.authed {
			s.authenticated(c) // no longer waiting
		}
		nc.Close()
	}()
	for {
		if c.r.Buffered() == 0 {
			if err := c.w.Flush(); err != nil {
				return
			}
			s.mu.Lock()
			closing := s.closing
			s.mu.Unlock()
			if closing {
				return
			}
			idle := s.o.IdleTimeout
			if !c.authed {
				idle = s.o.AuthTimeout
			}
			nc.SetReadDeadline(time.Now().Add(idle))
		}
		args, err := c.readCommand()
		if err != nil {
			var pe protocolError
			if errors.As(err, &pe) {
				c.writeError("ERR Protocol error: " + string(pe))
				c.w.Flush()
			}
			return
		}
		if len(args) == 0 {
			continue
		}
		c.active.Store(time.Now().UnixNano())
		if !c.dispatch(args) {
			c.w.Flush()
			return
		}
	}
}

type protocolError string

func (e protocolError) Error() string { return string(e) }

// readLine reads one CRLF-terminated line, without the CRLF.
func (c *conn) readLine(max int) ([]byte, error) {
	line, err := c.r.ReadSlice('\n')
	if errors.Is(err, bufio.ErrBufferFull) || len(line) > max+2 {
		return nil, protocolError("line too long")
	}
	if err != nil {
		return nil, err
	}
	line = line[:len(line)-1]
	if n := len(line); n > 0 && line[n-1] == '\r' {
		line = line[:n-1]
	}
	return line, nil
}

func (c *conn) readCommand() ([]string, error) {
	b, err := c.r.Peek(1)
	if err != nil {
		return nil, err
	}
	if b[0] != '*' {
		line, err := c.readLine(MaxInline)
		if err != nil {
			return nil, err
		}
		fields := strings.Fields(string(line))
		if len(fields) > MaxArgs {
			return nil, protocolError("too many arguments")
		}
		return fields, nil
	}
	line, err := c.readLine(32)
	if err != nil {
		return nil, err
	}
	n, err := strconv.Atoi(string(line[1:]))
	if err != nil || n > MaxArgs {
		return nil, protocolError("invalid multibulk length")
	}
	args := make([]string, 0, max(n, 0))
	for range n {
		line, err := c.readLine(32)
		if err != nil {
			return nil, err
		}
		if len(line) == 0 || line[0] != '$' {
			return nil, protocolError("expected '$', got '" + printable(line) + "'")
		}
		size, err := strconv.Atoi(string(line[1:]))
		if err != nil || size < 0 || size > MaxBulk {
			return nil, protocolError("invalid bulk length")
		}
		buf := make([]byte, size+2)
		if _, err := io.ReadFull(c.r, buf); err != nil {
			return nil, err
		}
		if buf[size] != '\r' || buf[size+1] != '\n' {
			return nil, protocolError("bulk string not terminated by CRLF")
		}
		args = append(args, string(buf[:size]))
	}
	return args, nil
}

func printable(b []byte) string {
	if len(b) > 16 {
		b = b[:16]
	}
	return strings.Map(func(r rune) rune {
		if r < 0x20 || r > 0x7e {
			return '?'
		}
		return r
	}, string(b))
}

// Reply writers.

func (c *conn) writeError(msg string) {
	c.w.WriteByte('-')
	c.w.WriteString(strings.NewReplacer("\r", " ", "\n", " ").Replace(msg))
	c.w.WriteString("\r\n")
}

func (c *conn) writeSimple(s string) { c.w.WriteString("+" + s + "\r\n") }

// writeNil writes the null reply: RESP3's null, or RESP2's null bulk
// string.
func (c *conn) writeNil() {
	if c.proto == 3 {
		c.w.WriteString("_\r\n")
		return
	}
	c.w.WriteString("$-1\r\n")
}

func (c *conn) writeInt(i int64) {
	c.w.WriteByte(':')
	c.w.WriteString(strconv.FormatInt(i, 10))
	c.w.WriteString("\r\n")
}

func (c *conn) writeBulk(s string) {
	c.w.WriteByte('$')
	c.w.WriteString(strconv.Itoa(len(s)))
	c.w.WriteString("\r\n")
	c.w.WriteString(s)
	c.w.WriteString("\r\n")
}

func (c *conn) writeArrayHeader(n int) {
	c.w.WriteByte('*')
	c.w.WriteString(strconv.Itoa(n))
	c.w.WriteString("\r\n")
}

func (c *conn) writeMapHeader(n int) {
	if c.proto == 3 {
		c.w.WriteByte('%')
		c.w.WriteString(strconv.Itoa(n))
		c.w.WriteString("\r\n")
		return
	}
	c.writeArrayHeader(2 * n)
}

func (c *conn) writeInts(v ...int64) {
	c.writeArrayHeader(len(v))
	for _, i := range v {
		c.writeInt(i)
	}
}

func errArgs(cmd string) string {
	return "ERR wrong number of arguments for '" + strings.ToLower(cmd) + "' command"
}

func parseInt(s string) (int64, bool) {
	i, err := strconv.ParseInt(s, 10, 64)
	return i, err == nil
}

// dispatch runs one command and reports whether to keep the connection.
func (c *conn) dispatch(args []string) bool {
	cmd := strings.ToUpper(args[0])
	switch cmd {
	case "QUIT":
		c.writeSimple("OK")
		return false
	case "AUTH":
		c.auth(args)
		return c.failures < c.s.o.MaxAuthFailures
	case "HELLO":
		c.hello(args)
		return c.failures < c.s.o.MaxAuthFailures
	}
	if !c.authed {
		c.writeError("NOAUTH Authentication required.")
		return true
	}
	ctx := c.ctx
	switch cmd {
	case "PING":
		switch len(args) {
		case 1:
			c.writeSimple("PONG")
		case 2:
			c.writeBulk(args[1])
		default:
			c.writeError(errArgs(cmd))
		}
	case "ECHO":
		if len(args) != 2 {
			c.writeError(errArgs(cmd))
			return true
		}
		c.writeBulk(args[1])
	case "SELECT":
		if len(args) != 2 {
			c.writeError(errArgs(cmd))
		} else if args[1] != "0" {
			c.writeError("ERR DB index is out of range")
		} else {
			c.writeSimple("OK")
		}
	case "COMMAND":
		if len(args) > 1 && strings.EqualFold(args[1], "COUNT") {
			c.writeInt(int64(len(commandNames)))
			return true
		}
		c.writeArrayHeader(0)
	case "CLIENT":
		c.client(args)
	case "CL.THROTTLE":
		c.throttle(ctx, args)
	case "FG.CHECK":
		c.check(ctx, args)
	case "FG.SETTLE":
		c.settle(ctx, args)
	case "FG.RESET":
		if len(args) != 3 {
			c.writeError(errArgs(cmd))
			return true
		}
		if err := c.s.svc.Reset(ctx, args[1], args[2]); err != nil {
			c.writeError(errText(err))
			return true
		}
		c.writeSimple("OK")
	case "FG.OVERRIDE":
		c.override(ctx, args)
	case "FG.RULES":
		rules := c.s.svc.Config().Rules
		c.writeArrayHeader(len(rules))
		for _, r := range rules {
			c.writeBulk(r.Name)
		}
	default:
		var b strings.Builder
		for _, a := range args[1:min(len(args), 4)] {
			b.WriteString("'" + printable([]byte(a)) + "' ")
		}
		c.writeError(fmt.Sprintf("ERR unknown command '%s', with args beginning with: %s", printable([]byte(args[0])), b.String()))
	}
	return true
}

var commandNames = []string{"cl.throttle", "fg.check", "fg.settle", "fg.reset", "fg.override", "fg.rules", "ping", "echo", "hello", "auth", "quit", "select", "command", "client"}

func (c *conn) checkAuth(user, pass string) bool {
	if c.s.token == "" {
		return true
	}
	_ = user // any user name: the token is the secret
	return subtle.ConstantTimeCompare([]byte(pass), []byte(c.s.token)) == 1
}

func (c *conn) auth(args []string) {
	var user, pass string
	switch len(args) {
	case 2:
		user, pass = "default", args[1]
	case 3:
		user, pass = args[1], args[2]
	default:
		c.writeError(errArgs("auth"))
		return
	}
	if c.s.token == "" {
		c.writeError("ERR AUTH called without any password configured for the default user. Are you sure your configuration is correct?")
		return
	}
	if !c.checkAuth(user, pass) {
		c.wrongPassword()
		return
	}
	c.setAuthed()
	c.writeSimple("OK")
}

// setAuthed records a successful authentication.
func (c *conn) setAuthed() {
	if !c.authed {
		c.authed = true
		c.s.authenticated(c)
	}
}

// wrongPassword answers a wrong password, counts it, and logs it at most
// once a second with the number of failures since the last line.
func (c *conn) wrongPassword() {
	c.failures++
	c.writeError("WRONGPASS invalid username-password pair or user is disabled.")
	s := c.s
	s.authFailures.Add(1)
	if held, ok := s.authLog.Allow(); ok {
		s.log.Warn("floodgate: wrong passwords on the Redis protocol", "failures", held+1, "last_from", c.c.RemoteAddr().String())
	}
}

func (c *conn) hello(args []string) {
	proto := c.proto
	if len(args) > 1 {
		v, ok := parseInt(args[1])
		if !ok {
			c.writeError("ERR Protocol version is not an integer or out of range")
			return
		}
		if v != 2 && v != 3 {
			c.writeError("NOPROTO unsupported protocol version")
			return
		}
		proto = int(v)
		for i := 2; i < len(args); i++ {
			switch strings.ToUpper(args[i]) {
			case "AUTH":
				if i+2 >= len(args) {
					c.writeError("ERR Syntax error in HELLO option 'auth'")
					return
				}
				if c.s.token != "" && !c.checkAuth(args[i+1], args[i+2]) {
					c.wrongPassword()
					return
				}
				c.setAuthed()
				i += 2
			case "SETNAME":
				if i+1 >= len(args) {
					c.writeError("ERR Syntax error in HELLO option 'setname'")
					return
				}
				i++
			default:
				c.writeError("ERR Syntax error in HELLO option '" + printable([]byte(args[i])) + "'")
				return
			}
		}
	}
	if !c.authed {
		c.writeError("NOAUTH HELLO must be called with the client already authenticated, otherwise the HELLO <proto> AUTH <user> <pass> option can be used to authenticate the client and select the RESP protocol version at the same time")
		return
	}
	c.proto = proto
	c.writeMapHeader(7)
	c.writeBulk("server")
	c.writeBulk("floodgate")
	c.writeBulk("version")
	c.writeBulk(c.s.version)
	c.writeBulk("proto")
	c.writeInt(int64(c.proto))
	c.writeBulk("id")
	c.writeInt(c.id)
	c.writeBulk("mode")
	c.writeBulk("standalone")
	c.writeBulk("role")
	c.writeBulk("master")
	c.writeBulk("modules")
	c.writeArrayHeader(0)
}

func (c *conn) client(args []string) {
	if len(args) < 2 {
		c.writeError(errArgs("client"))
		return
	}
	switch strings.ToUpper(args[1]) {
	case "ID":
		c.writeInt(c.id)
	case "SETNAME", "SETINFO", "NO-EVICT", "NO-TOUCH":
		c.writeSimple("OK")
	case "GETNAME":
		c.writeBulk("")
	default:
		c.writeError("ERR unknown subcommand '" + printable([]byte(args[1])) + "'. Try CLIENT HELP.")
	}
}

func errText(err error) string {
	switch {
	case errors.Is(err, service.ErrUnknownRule), errors.Is(err, service.ErrBadRequest):
		return "ERR " + err.Error()
	case errors.Is(err, floodgate.ErrKey):
		return "ERR " + err.Error() // "floodgate: key failed: redis: ..."
	}
	return "ERR store failed: " + err.Error()
}

func (c *conn) throttle(ctx context.Context, args []string) {
	if len(args) != 5 && len(args) != 6 {
		c.writeError(errArgs(args[0]))
		return
	}
	var v [4]int64
	v[3] = 1
	for i, a := range args[2:] {
		n, ok := parseInt(a)
		if !ok {
			c.writeError("ERR value is not an integer or out of range")
			return
		}
		v[i] = n
	}
	res, err := c.s.svc.Throttle(ctx, args[1], v[0], v[1], v[2], v[3])
	if err != nil {
		c.writeError(errText(err))
		return
	}
	c.writeDecision(res.Allowed, res, time.Second)
}

// writeDecision writes redis-cell's five integers: limited, limit,
// remaining, retry_after (-1 when allowed or never) and reset_after, the
// times in unit, rounded up.
func (c *conn) writeDecision(allowed bool, res floodgate.Result, unit time.Duration) {
	limited, retry := int64(0), int64(-1)
	if !allowed {
		limited = 1
		retry = arith.RoundUp(res.RetryAfter, unit) // -1 for never
	}
	c.writeInts(limited, res.Quota, res.Remaining, retry, arith.RoundUp(res.ResetAfter, unit))
}

func (c *conn) check(ctx context.Context, args []string) {
	if len(args) != 3 && len(args) != 4 {
		c.writeError(errArgs(args[0]))
		return
	}
	cost := int64(1)
	if len(args) == 4 {
		n, ok := parseInt(args[3])
		if !ok {
			c.writeError("ERR value is not an integer or out of range")
			return
		}
		cost = n
	}
	d, err := c.s.svc.Check(ctx, args[1], args[2], cost)
	if err != nil {
		c.writeError(errText(err))
		return
	}
	c.writeDecision(d.Allowed, d.Result, time.Millisecond)
}

func (c *conn) settle(ctx context.Context, args []string) {
	if len(args) != 5 {
		c.writeError(errArgs(args[0]))
		return
	}
	charged, ok1 := parseInt(args[3])
	cost, ok2 := parseInt(args[4])
	if !ok1 || !ok2 {
		c.writeError("ERR value is not an integer or out of range")
		return
	}
	d, err := c.s.svc.Settle(ctx, args[1], args[2], charged, cost)
	if err != nil {
		c.writeError(errText(err))
		return
	}
	c.writeDecision(d.Allowed, d.Result, time.Millisecond)
}

// override serves the FG.OVERRIDE family:
//
//	FG.OVERRIDE SET <rule> <key> <override>   the override in JSON or YAML, as PUT /v1/overrides takes it; +OK
//	FG.OVERRIDE GET <rule> <key>              [ttl_ms, limit...] (each limit as floodgate describes it), or nil
//	FG.OVERRIDE DEL <rule> <key> [<strategy>] +OK
//	FG.OVERRIDE LIST [<rule>]                 [[rule, key, ttl_ms, limit...], ...]
//
// ttl_ms is the time left, rounded up; 0 for ever.
func (c *conn) override(ctx context.Context, args []string) {
	if len(args) < 2 {
		c.writeError(errArgs(args[0]))
		return
	}
	sub := strings.ToUpper(args[1])
	want := map[string][2]int{"SET": {5, 5}, "GET": {4, 4}, "DEL": {4, 5}, "LIST": {2, 3}}
	n, ok := want[sub]
	if !ok {
		c.writeError(fmt.Sprintf("ERR unknown subcommand '%s'. Try FG.OVERRIDE SET, GET, DEL or LIST.", printable([]byte(args[1]))))
		return
	}
	if len(args) < n[0] || len(args) > n[1] {
		c.writeError(errArgs(args[0] + "|" + strings.ToLower(sub)))
		return
	}
	svc := c.s.svc
	switch sub {
	case "SET":
		o, err := config.ParseOverride("override", []byte(args[4]))
		if err != nil {
			c.writeError("ERR " + strings.ReplaceAll(err.Error(), "\n", "; "))
			return
		}
		if err := svc.SetOverride(ctx, args[2], args[3], o); err != nil {
			c.writeError(errText(err))
			return
		}
		c.writeSimple("OK")
	case "GET":
		o, ok, err := svc.GetOverride(ctx, args[2], args[3])
		switch {
		case err != nil:
			c.writeError(errText(err))
		case !ok:
			c.writeNil()
		default:
			c.writeOverride(o, false)
		}
	case "DEL":
		st := floodgate.Additive
		if len(args) == 5 {
			var err error
			if st, err = floodgate.ParseStrategy(strings.ToLower(args[4])); err != nil {
				c.writeError("ERR strategy must be additive, as-is, proportional or reset")
				return
			}
		}
		if err := svc.DeleteOverride(ctx, args[2], args[3], st); err != nil {
			c.writeError(errText(err))
			return
		}
		c.writeSimple("OK")
	case "LIST":
		rule := ""
		if len(args) == 3 {
			rule = args[2]
		}
		list, _, err := svc.ListOverrides(ctx, rule)
		if err != nil {
			c.writeError(errText(err))
			return
		}
		c.writeArrayHeader(len(list))
		for _, o := range list {
			c.writeOverride(o, true)
		}
	}
}

// writeOverride writes [ttl_ms, limit...], or with named
// [rule, key, ttl_ms, limit...].
func (c *conn) writeOverride(o service.Override, named bool) {
	n := 1 + len(o.Limits)
	if named {
		n += 2
		c.writeArrayHeader(n)
		c.writeBulk(o.Rule)
		c.writeBulk(o.Key)
	} else {
		c.writeArrayHeader(n)
	}
	c.writeInt(arith.RoundUp(o.TTL, time.Millisecond))
	for _, l := range o.Limits {
		c.writeBulk(l.String())
	}
}
