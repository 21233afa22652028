package main

import (
	"fmt"
	"io"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/floodgate/floodgate/internal/server/tlsconf"
	"github.com/floodgate/floodgate/internal/testkit/redistest"
	"github.com/floodgate/floodgate/internal/testkit/tlstest"
)

// TestRedisTLS runs floodgate serve against a redis-server that speaks
// only TLS and requires a client certificate: with the right files it is
// ready and decides on Redis; each wrong one leaves it degraded, with the
// cause in /readyz and in the log.
func TestRedisTLS(t *testing.T) {
	dir := t.TempDir()
	ca := tlstest.NewCA(t)
	f := ca.Write(t, dir, 31)
	srv := redistest.StartTLS(t, f)
	other := tlstest.NewCA(t).Write(t, t.TempDir(), 32)
	expCert, expKey := ca.WriteClient(t, dir, "expired", time.Now().Add(-time.Hour))
	url := "rediss://" + srv.Addr + "/0"
	cert := []string{"--redis-tls-cert", f.ClientCert, "--redis-tls-key", f.ClientKey}
	for _, tc := range []struct {
		name  string
		args  []string
		cause string // in /readyz and the log; empty: ready
		log   string // in the log too
	}{
		{"client certificate", append([]string{"--redis", url, "--redis-tls-ca", f.CA}, cert...), "", ""},
		{"redis scheme, TLS 1.3, server name", append([]string{"--redis", "redis://" + srv.Addr, "--redis-tls-ca", f.CA, "--redis-tls-min-version", "1.3", "--redis-tls-server-name", "localhost"}, cert...), "", ""},
		{"insecure", append([]string{"--redis", url, "--redis-tls-insecure-skip-verify"}, cert...), "", "NOT checked"},
		{"URL options", []string{"--redis", fmt.Sprintf("rediss://%s/0?tls_ca=%s&tls_cert=%s&tls_key=%s&tls_min_version=1.3&tls_server_name=localhost", srv.Addr, f.CA, f.ClientCert, f.ClientKey)}, "", ""},
		{"URL option insecure", []string{"--redis", url + "?tls_cert=" + f.ClientCert + "&tls_key=" + f.ClientKey + "&tls_insecure_skip_verify=true"}, "", "NOT checked"},
		{"no client certificate", []string{"--redis", url, "--redis-tls-ca", f.CA}, "requires a client certificate, and none is configured", ""},
		{"wrong CA", append([]string{"--redis", url, "--redis-tls-ca", other.CA}, cert...), "not signed by the CA in " + other.CA, ""},
		{"expired client certificate", []string{"--redis", url, "--redis-tls-ca", f.CA, "--redis-tls-cert", expCert, "--redis-tls-key", expKey}, "refused the client certificate " + expCert, "client certificate has expired"},
		{"wrong server name", append([]string{"--redis", url, "--redis-tls-ca", f.CA, "--redis-tls-server-name", "redis.example"}, cert...), `does not name \"redis.example\"`, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			in := serve(t, append(tc.args, "--budget", "2s")...)
			code, body := in.get(t, "/readyz")
			if tc.cause == "" {
				if code != 200 {
					t.Fatalf("/readyz: %d %v\n%s", code, body, in.stderr)
				}
				if _, got := in.post(t, "/v1/check", `{"rule":"example","key":"tls"}`); got["source"] != "store" {
					t.Fatalf("decided by %v, not Redis\n%s", got["source"], in.stderr)
				}
			} else {
				cause, _ := body["cause"].(string)
				if code != 503 || !strings.Contains(cause, strings.ReplaceAll(tc.cause, `\"`, `"`)) {
					t.Fatalf("/readyz: %d %v; want 503 with a cause that says %q", code, body, tc.cause)
				}
				if !strings.Contains(in.stderr.String(), tc.cause) {
					t.Fatalf("the log does not say %q:\n%s", tc.cause, in.stderr)
				}
			}
			if !strings.Contains(in.stderr.String(), tc.log) {
				t.Fatalf("the log does not say %q:\n%s", tc.log, in.stderr)
			}
		})
	}
}

// TestRedisTLSReload renews an expired client certificate in place: after
// SIGHUP floodgate serve presents the new one, and Redis answers.
func TestRedisTLSReload(t *testing.T) {
	dir := t.TempDir()
	ca := tlstest.NewCA(t)
	f := ca.Write(t, dir, 41)
	srv := redistest.StartTLS(t, f)
	cert, key := ca.WriteClient(t, dir, "floodgate", time.Now().Add(-time.Minute))
	in := serve(t, "--redis", "rediss://"+srv.Addr, "--redis-tls-ca", f.CA, "--redis-tls-cert", cert, "--redis-tls-key", key, "--budget", "2s")
	if code, body := in.get(t, "/readyz"); code != 503 {
		t.Fatalf("/readyz with an expired certificate: %d %v", code, body)
	}
	ca.WriteClient(t, dir, "floodgate", time.Now().Add(time.Hour))
	if err := in.cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "readyz after the renewed certificate's reload", func() bool { code, _ := in.get(t, "/readyz"); return code == 200 })
	if !strings.Contains(in.stderr.String(), "Redis TLS certificates reloaded") {
		t.Errorf("no reload in the log:\n%s", in.stderr)
	}
}

// TestRedisTLSEnv: every --redis-tls-* flag has its FLOODGATE_ variable.
func TestRedisTLSEnv(t *testing.T) {
	want := tlsconf.ClientFiles{CA: "ca.pem", Cert: "c.pem", Key: "k.pem", ServerName: "redis.example", InsecureSkipVerify: true}
	for k, v := range map[string]string{"FLOODGATE_REDIS_TLS_CA": want.CA, "FLOODGATE_REDIS_TLS_CERT": want.Cert, "FLOODGATE_REDIS_TLS_KEY": want.Key,
		"FLOODGATE_REDIS_TLS_SERVER_NAME": want.ServerName, "FLOODGATE_REDIS_TLS_INSECURE_SKIP_VERIFY": "true", "FLOODGATE_REDIS_TLS_MIN_VERSION": "1.3"} {
		t.Setenv(k, v)
	}
	f, code, ok := parseServeFlags(nil, io.Discard)
	if !ok {
		t.Fatalf("flags refused, exit status %d", code)
	}
	if f.store.tls != want || f.store.minVersion != "1.3" {
		t.Errorf("got %+v, TLS %s; want %+v, TLS 1.3", f.store.tls, f.store.minVersion, want)
	}
}

// TestRedisTLSFlags checks the flags' errors.
func TestRedisTLSFlags(t *testing.T) {
	ca := tlstest.NewCA(t)
	f := ca.Write(t, t.TempDir(), 51)
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--redis-tls-ca", f.CA}, "need --redis or --redis-cluster"},
		{[]string{"--redis", "rediss://127.0.0.1:1", "--redis-tls-min-version", "1.1"}, `TLS version "1.1"`},
		{[]string{"--redis", "rediss://127.0.0.1:1", "--redis-tls-cert", f.ClientCert}, "needs both a certificate and a key"},
		{[]string{"--redis", "rediss://127.0.0.1:1", "--redis-tls-ca", f.ClientKey}, "no PEM certificate"},
		{[]string{"--redis", "rediss://127.0.0.1:1?tls_ca=" + f.ClientKey}, "no PEM certificate"},
		{[]string{"--redis", "rediss://127.0.0.1:1?tls_ca=a.pem", "--redis-tls-ca", "b.pem"}, "tls_ca=a.pem, but its flag says b.pem"},
		{[]string{"--redis", "rediss://127.0.0.1:1?tls_insecure_skip_verify=maybe"}, "tls_insecure_skip_verify"},
	} {
		var stdout, stderr strings.Builder
		args := append([]string{"--http", "127.0.0.1:0", "--resp", "127.0.0.1:0"}, tc.args...)
		if code := serveCmd(t.Context(), args, &stdout, &stderr, nil); code != 2 || !strings.Contains(stderr.String(), tc.want) {
			t.Errorf("serve %s: exit %d, %s; want 2 and %q", strings.Join(tc.args, " "), code, stderr.String(), tc.want)
		}
	}
}

// TestRedisTLSClusterSentinel runs floodgate serve against a Redis
// Cluster and a Sentinel set that speak only TLS and require client
// certificates: the flags reach every node, Sentinel and master.
func TestRedisTLSClusterSentinel(t *testing.T) {
	dir := t.TempDir()
	f := tlstest.NewCA(t).Write(t, dir, 61)
	tlsArgs := []string{"--redis-tls-ca", f.CA, "--redis-tls-cert", f.ClientCert, "--redis-tls-key", f.ClientKey, "--budget", "2s"}
	cluster := redistest.StartTLSCluster(t, 3, f)
	sentinel := redistest.StartTLSSentinel(t, f)
	for _, tc := range []struct {
		name string
		args []string
	}{
		{"cluster URL", []string{"--redis", "rediss+cluster://" + cluster.Addrs[0] + "?addr=" + cluster.Addrs[1]}},
		{"--redis-cluster", []string{"--redis-cluster", strings.Join(cluster.Addrs, ",")}},
		{"sentinel", []string{"--redis", sentinel.URL()}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			in := serve(t, append(tc.args, tlsArgs...)...)
			if code, body := in.get(t, "/readyz"); code != 200 {
				t.Fatalf("/readyz: %d %v\n%s", code, body, in.stderr)
			}
			for i := range 20 {
				// Keys on every node of the Cluster.
				if _, got := in.post(t, "/v1/check", fmt.Sprintf(`{"rule":"example","key":"k%d"}`, i)); got["source"] != "store" {
					t.Fatalf("decided by %v, not Redis\n%s", got["source"], in.stderr)
				}
			}
		})
	}
	// Without a client certificate every one of them refuses.
	in := serve(t, "--redis", sentinel.URL(), "--redis-tls-ca", f.CA, "--budget", "2s")
	if code, body := in.get(t, "/readyz"); code != 503 || !strings.Contains(fmt.Sprint(body["cause"]), "requires a client certificate") {
		t.Fatalf("/readyz through Sentinel without a client certificate: %d %v", code, body)
	}
}
