package tlsconf_test

import (
	"crypto/tls"
	"net"
	"os"
	"testing"
	"time"

	"github.com/floodgate/floodgate/internal/server/tlsconf"
	"github.com/floodgate/floodgate/internal/testkit/tlstest"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// serve accepts TLS connections on a loopback port and completes their
// handshakes until the test ends.
func serve(t *testing.T, cfg *tls.Config) string {
	t.Helper()
	ln, err := tls.Listen("tcp", "127.0.0.1:0", cfg)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.SetDeadline(time.Now().Add(5 * time.Second))
			c.(*tls.Conn).Handshake()
			c.Close()
		}
	}()
	t.Cleanup(func() { ln.Close(); <-done })
	return ln.Addr().String()
}

// serial dials addr and returns the serial number of the server's
// certificate, or the handshake's error.
func serial(addr string, cfg *tls.Config) (int64, error) {
	d := &net.Dialer{Timeout: 5 * time.Second}
	c, err := tls.DialWithDialer(d, "tcp", addr, cfg)
	if err != nil {
		return 0, err
	}
	defer c.Close()
	// With TLS 1.3 a rejected client certificate shows at the first read.
	c.SetReadDeadline(time.Now().Add(200 * time.Millisecond))
	if _, err := c.Read(make([]byte, 1)); err != nil {
		if ne, ok := err.(net.Error); !ok || !ne.Timeout() {
			if err.Error() != "EOF" {
				return 0, err
			}
		}
	}
	return c.ConnectionState().PeerCertificates[0].SerialNumber.Int64(), nil
}

func TestMutualTLSAndReload(t *testing.T) {
	dir := t.TempDir()
	ca := tlstest.NewCA(t)
	f := ca.Write(t, dir, 7)
	r, err := tlsconf.Load(tlsconf.Files{Cert: f.Cert, Key: f.Key, ClientCA: f.CA})
	if err != nil {
		t.Fatal(err)
	}
	addr := serve(t, r.Config())
	if n, err := serial(addr, tlstest.ClientConfig(t, f, true)); err != nil || n != 7 {
		t.Fatalf("with a client certificate: serial %d, %v", n, err)
	}
	if _, err := serial(addr, tlstest.ClientConfig(t, f, false)); err == nil {
		t.Fatal("a client without a certificate got through mutual TLS")
	}
	// New files, then a reload: new handshakes see the new certificate.
	f = ca.Write(t, dir, 8)
	if err := r.Reload(); err != nil {
		t.Fatal(err)
	}
	if n, err := serial(addr, tlstest.ClientConfig(t, f, true)); err != nil || n != 8 {
		t.Fatalf("after the reload: serial %d, %v", n, err)
	}
	// A broken file fails the reload and keeps the loaded certificate.
	tlstestWrite(t, f.Key, "not a key")
	if err := r.Reload(); err == nil {
		t.Fatal("a reload with a broken key succeeded")
	}
	if n, err := serial(addr, tlstest.ClientConfig(t, f, true)); err != nil || n != 8 {
		t.Fatalf("after a failed reload: serial %d, %v", n, err)
	}
	if _, err := tlsconf.Load(tlsconf.Files{Cert: f.Cert}); err == nil {
		t.Error("Load without a key file succeeded")
	}
}

func tlstestWrite(t *testing.T, path, s string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(s), 0o600); err != nil {
		t.Fatal(err)
	}
}
