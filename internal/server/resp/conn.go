package resp

// A connection: reading frames within their bounds, writing replies
// under a deadline, and running one command at a time.

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net"
	"strconv"
	"strings"
	"sync/atomic"
	"time"
)

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
