// Package tlsconf serves TLS, and mutual TLS, from certificate files that
// can be reloaded while connections are being accepted: a reload that
// fails keeps what was loaded.
package tlsconf

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
	"sync/atomic"
)

// Files name the PEM files of a server: its certificate (chain) and key,
// and, for mutual TLS, the CA certificates that client certificates must
// chain to.
type Files struct {
	Cert, Key string
	ClientCA  string // empty: no client certificates asked for
}

// Reloader holds the loaded certificates and hands them to every new
// handshake. It is safe for concurrent use.
type Reloader struct {
	files Files
	cur   atomic.Pointer[loaded]
}

type loaded struct {
	cert     tls.Certificate
	clientCA *x509.CertPool
}

// Load reads files and returns a Reloader for them.
func Load(files Files) (*Reloader, error) {
	if files.Cert == "" || files.Key == "" {
		return nil, errors.New("TLS needs both a certificate and a key file")
	}
	r := &Reloader{files: files}
	if err := r.Reload(); err != nil {
		return nil, err
	}
	return r, nil
}

// Reload reads the files again. New handshakes use what it read; when it
// fails, they keep using what was loaded before, and the error says why.
func (r *Reloader) Reload() error {
	cert, err := tls.LoadX509KeyPair(r.files.Cert, r.files.Key)
	if err != nil {
		return fmt.Errorf("TLS certificate %s, key %s: %w", r.files.Cert, r.files.Key, err)
	}
	l := &loaded{cert: cert}
	if r.files.ClientCA != "" {
		b, err := os.ReadFile(r.files.ClientCA)
		if err != nil {
			return fmt.Errorf("TLS client CA: %w", err)
		}
		l.clientCA = x509.NewCertPool()
		if !l.clientCA.AppendCertsFromPEM(b) {
			return fmt.Errorf("TLS client CA %s: no PEM certificate in it", r.files.ClientCA)
		}
	}
	r.cur.Store(l)
	return nil
}

// Config returns a server configuration whose every handshake uses the
// certificates loaded last: TLS 1.2 or later, and, with a client CA, a
// verified client certificate required.
func (r *Reloader) Config() *tls.Config {
	return &tls.Config{
		MinVersion: tls.VersionTLS12,
		GetConfigForClient: func(*tls.ClientHelloInfo) (*tls.Config, error) {
			l := r.cur.Load()
			c := &tls.Config{MinVersion: tls.VersionTLS12, Certificates: []tls.Certificate{l.cert}}
			if l.clientCA != nil {
				c.ClientAuth, c.ClientCAs = tls.RequireAndVerifyClientCert, l.clientCA
			}
			return c, nil
		},
	}
}
