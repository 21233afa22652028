package resp

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"sync"
	"time"

	"github.com/floodgate/floodgate/internal/lib/lograte"
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
