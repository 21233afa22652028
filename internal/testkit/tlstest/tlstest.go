// Package tlstest makes certificates for tests with crypto/x509: a CA, a
// server certificate for 127.0.0.1 and ::1, and a client certificate, all
// written as PEM files.
package tlstest

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// Files are the PEM files of a test PKI.
type Files struct {
	CA                    string // the CA's certificate
	Cert, Key             string // the server's
	ClientCert, ClientKey string // a client's, signed by the CA
	Serial                int64  // the server certificate's serial number
}

// CA is a certificate authority that signs test certificates.
type CA struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	pem  []byte
}

// NewCA returns a new CA.
func NewCA(t testing.TB) *CA {
	t.Helper()
	key := newKey(t)
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "floodgate test CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, _ := x509.ParseCertificate(der)
	return &CA{cert: cert, key: key, pem: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})}
}

// Write writes the CA, a server certificate of the given serial number and
// a client certificate into dir.
func (ca *CA) Write(t testing.TB, dir string, serial int64) Files {
	t.Helper()
	f := Files{
		CA: filepath.Join(dir, "ca.pem"), Cert: filepath.Join(dir, "server.pem"), Key: filepath.Join(dir, "server-key.pem"),
		ClientCert: filepath.Join(dir, "client.pem"), ClientKey: filepath.Join(dir, "client-key.pem"), Serial: serial,
	}
	write(t, f.CA, ca.pem)
	ca.issue(t, f.Cert, f.Key, &x509.Certificate{
		SerialNumber: big.NewInt(serial), Subject: pkix.Name{CommonName: "127.0.0.1"},
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback}, DNSNames: []string{"localhost"},
		// Client auth too: a Redis replica, Sentinel or Cluster node
		// presents its server certificate to the servers it connects to.
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
	})
	ca.issue(t, f.ClientCert, f.ClientKey, &x509.Certificate{
		SerialNumber: big.NewInt(serial + 1000), Subject: pkix.Name{CommonName: "client"},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	})
	return f
}

func (ca *CA) issue(t testing.TB, certPath, keyPath string, tmpl *x509.Certificate) {
	t.Helper()
	key := newKey(t)
	if tmpl.NotAfter.IsZero() {
		tmpl.NotBefore, tmpl.NotAfter = time.Now().Add(-time.Hour), time.Now().Add(24*time.Hour)
	}
	tmpl.KeyUsage = x509.KeyUsageDigitalSignature
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		t.Fatal(err)
	}
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	// Write to temporary names and rename, so that a reader never sees
	// half a file.
	write(t, certPath, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}))
	write(t, keyPath, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder}))
}

// WriteClient writes a client certificate signed by the CA, valid until
// notAfter (one that expired already when it is in the past), as
// dir/name.pem and dir/name-key.pem, and returns their paths.
func (ca *CA) WriteClient(t testing.TB, dir, name string, notAfter time.Time) (cert, key string) {
	t.Helper()
	cert, key = filepath.Join(dir, name+".pem"), filepath.Join(dir, name+"-key.pem")
	ca.issue(t, cert, key, &x509.Certificate{
		SerialNumber: big.NewInt(time.Now().UnixNano()), Subject: pkix.Name{CommonName: name},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
		NotBefore:   notAfter.Add(-48 * time.Hour), NotAfter: notAfter,
	})
	return cert, key
}

func newKey(t testing.TB) *ecdsa.PrivateKey {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return key
}

func write(t testing.TB, path string, b []byte) {
	t.Helper()
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

// ClientConfig returns a TLS client configuration that trusts the CA of
// f and, when withCert, presents f's client certificate.
func ClientConfig(t testing.TB, f Files, withCert bool) *tls.Config {
	t.Helper()
	pool := x509.NewCertPool()
	b, err := os.ReadFile(f.CA)
	if err != nil {
		t.Fatal(err)
	}
	pool.AppendCertsFromPEM(b)
	c := &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
	if withCert {
		cert, err := tls.LoadX509KeyPair(f.ClientCert, f.ClientKey)
		if err != nil {
			t.Fatal(err)
		}
		c.Certificates = []tls.Certificate{cert}
	}
	return c
}
