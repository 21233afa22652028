package tlsconf_test

import (
	"context"
	"crypto/tls"
	"strings"
	"testing"
	"time"

	"github.com/floodgate/floodgate/internal/server/tlsconf"
	"github.com/floodgate/floodgate/internal/testkit/redistest"
	"github.com/floodgate/floodgate/internal/testkit/tlstest"
	"github.com/redis/go-redis/v9"
)

// ping connects to addr through c's dialer, as floodgate's Redis client
// does, and returns PING's error.
func ping(t *testing.T, c *tlsconf.Client, addr string) error {
	t.Helper()
	rc := redis.NewClient(&redis.Options{Addr: addr, Dialer: c.Dial, MaxRetries: -1, DialTimeout: 2 * time.Second})
	defer rc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	return rc.Ping(ctx).Err()
}

// TestClientRedis connects to a redis-server that requires TLS and a
// client certificate, and checks that each misconfiguration fails with
// its cause named.
func TestClientRedis(t *testing.T) {
	dir := t.TempDir()
	ca := tlstest.NewCA(t)
	f := ca.Write(t, dir, 11)
	srv := redistest.StartTLS(t, f)
	other := tlstest.NewCA(t).Write(t, t.TempDir(), 12)
	expCert, expKey := ca.WriteClient(t, dir, "expired", time.Now().Add(-time.Hour))
	for _, tc := range []struct {
		name  string
		files tlsconf.ClientFiles
		want  string // in the error; empty: PING succeeds
	}{
		{"client certificate", tlsconf.ClientFiles{CA: f.CA, Cert: f.ClientCert, Key: f.ClientKey}, ""},
		{"TLS 1.3", tlsconf.ClientFiles{CA: f.CA, Cert: f.ClientCert, Key: f.ClientKey, MinVersion: tls.VersionTLS13}, ""},
		{"server name", tlsconf.ClientFiles{CA: f.CA, Cert: f.ClientCert, Key: f.ClientKey, ServerName: "localhost"}, ""},
		{"insecure", tlsconf.ClientFiles{Cert: f.ClientCert, Key: f.ClientKey, InsecureSkipVerify: true}, ""},
		{"no client certificate", tlsconf.ClientFiles{CA: f.CA}, "requires a client certificate, and none is configured"},
		{"wrong CA", tlsconf.ClientFiles{CA: other.CA, Cert: f.ClientCert, Key: f.ClientKey}, "not signed by the CA in " + other.CA},
		{"client certificate of another CA", tlsconf.ClientFiles{CA: f.CA, Cert: other.ClientCert, Key: other.ClientKey}, "refused the client certificate " + other.ClientCert},
		{"expired client certificate", tlsconf.ClientFiles{CA: f.CA, Cert: expCert, Key: expKey}, "refused the client certificate " + expCert + ": expired"},
		{"wrong server name", tlsconf.ClientFiles{CA: f.CA, Cert: f.ClientCert, Key: f.ClientKey, ServerName: "redis.example"}, `does not name "redis.example"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := tlsconf.LoadClient(tc.files)
			if err != nil {
				t.Fatal(err)
			}
			err = ping(t, c, srv.Addr)
			switch {
			case tc.want == "" && err != nil:
				t.Fatalf("PING: %v", err)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
				t.Fatalf("PING: %v; want an error with %q", err, tc.want)
			}
		})
	}
}

// TestClientReload checks that new connections use the files a Reload
// read, and that a failed Reload keeps what was loaded.
func TestClientReload(t *testing.T) {
	dir := t.TempDir()
	ca := tlstest.NewCA(t)
	f := ca.Write(t, dir, 21)
	srv := redistest.StartTLS(t, f)
	cert, key := ca.WriteClient(t, dir, "floodgate", time.Now().Add(-time.Minute))
	c, err := tlsconf.LoadClient(tlsconf.ClientFiles{CA: f.CA, Cert: cert, Key: key})
	if err != nil {
		t.Fatal(err)
	}
	if err := ping(t, c, srv.Addr); err == nil || !strings.Contains(err.Error(), "expired") {
		t.Fatalf("with an expired certificate: %v", err)
	}
	renewed := time.Now().Add(time.Hour).Truncate(time.Second)
	ca.WriteClient(t, dir, "floodgate", renewed)
	if err := c.Reload(); err != nil {
		t.Fatal(err)
	}
	if !c.Expiry().Equal(renewed) {
		t.Errorf("Expiry %s, want %s", c.Expiry(), renewed)
	}
	if err := ping(t, c, srv.Addr); err != nil {
		t.Fatalf("after the reload: %v", err)
	}
	tlstestWrite(t, key, "not a key")
	if err := c.Reload(); err == nil {
		t.Fatal("a reload with a broken key succeeded")
	}
	if err := ping(t, c, srv.Addr); err != nil {
		t.Fatalf("after a failed reload: %v", err)
	}
	for _, files := range []tlsconf.ClientFiles{{Cert: cert}, {Key: key}, {CA: key}} {
		if _, err := tlsconf.LoadClient(files); err == nil {
			t.Errorf("LoadClient(%+v) succeeded", files)
		}
	}
}
