package tlsconf

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strings"
	"sync/atomic"
	"syscall"
	"time"
)

// ClientFiles configure the TLS connections of a client (floodgate's to
// Redis): the CA certificates that the server's must chain to, the
// client certificate it presents, and how it checks the server.
type ClientFiles struct {
	CA        string // PEM CA certificates; empty: the system's roots
	Cert, Key string // PEM client certificate (chain) and key; empty: none
	// ServerName is the name the server's certificate must hold; empty:
	// the host of the address dialed, so that each Cluster node, Sentinel
	// and master is checked against its own address.
	ServerName string
	// InsecureSkipVerify accepts any server certificate.
	InsecureSkipVerify bool
	// MinVersion is the oldest TLS version accepted; 0 is TLS 1.2.
	MinVersion uint16
}

// ParseVersion reads "1.2" or "1.3" as a TLS version.
func ParseVersion(s string) (uint16, error) {
	switch strings.TrimSpace(s) {
	case "1.2":
		return tls.VersionTLS12, nil
	case "1.3":
		return tls.VersionTLS13, nil
	}
	return 0, fmt.Errorf("TLS version %q: want 1.2 or 1.3", s)
}

// Client holds a client's loaded certificates and dials with them. It is
// safe for concurrent use.
type Client struct {
	files ClientFiles
	cur   atomic.Pointer[clientLoaded]
	// DialTimeout bounds a dial and its handshake, as go-redis's own
	// dialer does (its default, 5s, when 0).
	DialTimeout time.Duration
}

type clientLoaded struct {
	roots *x509.CertPool   // nil: the system's
	cert  *tls.Certificate // nil: none
}

// LoadClient reads files and returns a Client for them.
func LoadClient(files ClientFiles) (*Client, error) {
	if (files.Cert == "") != (files.Key == "") {
		return nil, errors.New("a TLS client certificate needs both a certificate and a key file")
	}
	if files.MinVersion == 0 {
		files.MinVersion = tls.VersionTLS12
	}
	c := &Client{files: files}
	if err := c.Reload(); err != nil {
		return nil, err
	}
	return c, nil
}

// Reload reads the files again. New connections use what it read; when
// it fails, they keep using what was loaded before, and the error says
// why.
func (c *Client) Reload() error {
	l := &clientLoaded{}
	if c.files.CA != "" {
		b, err := os.ReadFile(c.files.CA)
		if err != nil {
			return fmt.Errorf("TLS CA: %w", err)
		}
		l.roots = x509.NewCertPool()
		if !l.roots.AppendCertsFromPEM(b) {
			return fmt.Errorf("TLS CA %s: no PEM certificate in it", c.files.CA)
		}
	}
	if c.files.Cert != "" {
		cert, err := tls.LoadX509KeyPair(c.files.Cert, c.files.Key)
		if err != nil {
			return fmt.Errorf("TLS client certificate %s, key %s: %w", c.files.Cert, c.files.Key, err)
		}
		l.cert = &cert
	}
	c.cur.Store(l)
	return nil
}

// Files returns the files c reads.
func (c *Client) Files() ClientFiles { return c.files }

// Expiry returns when the loaded client certificate stops being valid,
// or the zero time without one.
func (c *Client) Expiry() time.Time {
	l := c.cur.Load()
	if l.cert == nil || len(l.cert.Certificate) == 0 {
		return time.Time{}
	}
	leaf, err := x509.ParseCertificate(l.cert.Certificate[0])
	if err != nil {
		return time.Time{}
	}
	return leaf.NotAfter
}

// Config returns a TLS configuration with the certificates loaded last,
// for a connection to host (when ServerName is empty).
func (c *Client) Config(host string) *tls.Config {
	l := c.cur.Load()
	cfg := &tls.Config{
		MinVersion: c.files.MinVersion, RootCAs: l.roots, ServerName: c.files.ServerName,
		InsecureSkipVerify: c.files.InsecureSkipVerify,
	}
	if cfg.ServerName == "" {
		cfg.ServerName = host
	}
	if l.cert != nil {
		cfg.Certificates = []tls.Certificate{*l.cert}
	}
	return cfg
}

// Dial opens a TLS connection to addr with the certificates loaded last;
// its signature is go-redis's Dialer's. A failed handshake's error names
// its likely cause and the flag that sets it, and so does a refusal that
// TLS 1.3 shows only at the connection's first read.
func (c *Client) Dial(ctx context.Context, network, addr string) (net.Conn, error) {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, err
	}
	timeout := c.DialTimeout
	if timeout <= 0 {
		timeout = 5 * time.Second
	}
	d := &tls.Dialer{NetDialer: &net.Dialer{Timeout: timeout, KeepAlive: 5 * time.Minute}, Config: c.Config(host)}
	conn, err := d.DialContext(ctx, network, addr)
	if err != nil {
		return nil, c.explain(addr, err)
	}
	return &explainConn{Conn: conn, c: c, addr: addr}, nil
}

// explainConn names the cause of a TLS alert its peer sends after the
// handshake: with TLS 1.3 the server checks the client's certificate
// after the client finished its handshake. A server may also just close
// the connection: then the cause is a guess, and says so.
type explainConn struct {
	net.Conn
	c        *Client
	addr     string
	answered atomic.Bool // the server sent a byte after the handshake
}

func (e *explainConn) Read(p []byte) (int, error) {
	n, err := e.Conn.Read(p)
	if n > 0 {
		e.answered.Store(true)
	}
	return n, e.wrap(err)
}

func (e *explainConn) Write(p []byte) (int, error) {
	n, err := e.Conn.Write(p)
	return n, e.wrap(err)
}

// wrap names the likely cause of err, the connection's failure.
func (e *explainConn) wrap(err error) error {
	switch {
	case err == nil:
		return nil
	case strings.Contains(err.Error(), "remote error: tls: "):
		return e.c.explain(e.addr, err)
	case !e.answered.Load() && (errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE) || errors.Is(err, io.EOF)):
		return &tlsError{addr: e.addr, why: e.c.reset(), err: err}
	}
	return err
}

// explain wraps err, a TLS failure with the server at addr, with its
// likely cause in the terms of the files.
func (c *Client) explain(addr string, err error) error {
	var (
		unknown  x509.UnknownAuthorityError
		hostname x509.HostnameError
		invalid  x509.CertificateInvalidError
	)
	ca := "the system's roots"
	if c.files.CA != "" {
		ca = "the CA in " + c.files.CA
	}
	var why string
	switch {
	case errors.As(err, &unknown):
		why = "the server's certificate is not signed by " + ca
	case errors.As(err, &hostname):
		why = fmt.Sprintf("the server's certificate does not name %q (the server name to check)", hostname.Host)
	case errors.As(err, &invalid) && invalid.Reason == x509.Expired:
		why = "the server's certificate has expired or is not valid yet"
	case strings.Contains(err.Error(), "remote error: tls: "):
		why = c.refusal(err.Error())
	}
	return &tlsError{addr: addr, why: why, err: err}
}

// tlsError is a TLS failure with its likely cause. Its Unwrap returns a
// list, so that errors.Is and errors.As see err, but errors.Unwrap, which
// go-redis applies to a failed connection's error, keeps the cause.
type tlsError struct {
	addr, why string
	err       error
}

func (e *tlsError) Error() string {
	if e.why == "" {
		return "TLS with Redis at " + e.addr + ": " + e.err.Error()
	}
	return "TLS with Redis at " + e.addr + ": " + e.why + ": " + e.err.Error()
}

func (e *tlsError) Unwrap() []error { return []error{e.err} }

// reset names the likely cause of a connection the server reset right
// after the handshake.
func (c *Client) reset() string {
	if c.cur.Load().cert == nil {
		return "the server closed the connection after the TLS handshake: it likely requires a client certificate, and none is configured"
	}
	if exp := c.Expiry(); !exp.IsZero() && time.Now().After(exp) {
		return "the server closed the connection after the TLS handshake: it likely refused the client certificate " + c.files.Cert + ": expired at " + exp.UTC().Format(time.RFC3339)
	}
	return "the server closed the connection after the TLS handshake: it likely refused the client certificate " + c.files.Cert
}

// refusal names why the server refused the handshake, from its alert.
func (c *Client) refusal(alert string) string {
	switch {
	case strings.Contains(alert, "certificate required"), strings.Contains(alert, "handshake failure") && c.cur.Load().cert == nil:
		return "the server requires a client certificate, and none is configured"
	case strings.Contains(alert, "expired certificate"):
		return "the server refused the client certificate " + c.files.Cert + ": expired"
	case strings.Contains(alert, "unknown certificate authority"), strings.Contains(alert, "bad certificate"):
		return "the server refused the client certificate " + c.files.Cert + ": not from a CA it trusts, or not valid"
	case strings.Contains(alert, "protocol version"):
		return "the server does not speak the TLS versions allowed"
	}
	return "the server refused the TLS handshake"
}
