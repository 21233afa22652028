package main

import (
	"bytes"
	"context"
	"crypto/tls"
	"io"
	"strings"
	"testing"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	rlsconf "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	"github.com/floodgate/floodgate/internal/testkit/envoytest"
	"github.com/floodgate/floodgate/internal/testkit/tlstest"
	"github.com/floodgate/floodgate/internal/testkit/xdstest"
)

// TestXDSFlags: the --xds-* flags and their variables reach the client's
// options, and what cannot work is refused with the flag's name.
func TestXDSFlags(t *testing.T) {
	for _, tc := range []struct {
		name    string
		args    []string
		env     map[string]string
		wantErr string
		check   func(t *testing.T, s *xdsSetup)
	}{
		{name: "none", check: func(t *testing.T, s *xdsSetup) {
			if s != nil {
				t.Errorf("xDS set up without --xds-server: %+v", s)
			}
		}},
		{name: "flags", args: []string{"--xds-server", "127.0.0.1:18000", "--xds-node-id", "gw", "--xds-node-metadata", "a=1, b = x=y",
			"--xds-headers", "authorization:Bearer t,x-team=edge", "--xds-backoff-min", "1s", "--xds-backoff-max", "5s", "--xds-max-msg-size", "16MiB",
			"--merge-domain-config"},
			check: func(t *testing.T, s *xdsSetup) {
				o := s.opts
				if o.Server != "127.0.0.1:18000" || o.NodeID != "gw" || o.NodeMetadata["a"] != "1" || o.NodeMetadata["b"] != "x=y" ||
					o.Headers["authorization"] != "Bearer t" || o.Headers["x-team"] != "edge" || o.BackoffMin.String() != "1s" ||
					o.BackoffMax.String() != "5s" || o.MaxMsgSize != 16<<20 || o.TLS != nil || s.tls != nil || !o.MergeDomains {
					t.Errorf("options %+v", o)
				}
			}},
		{name: "variables", env: map[string]string{"FLOODGATE_XDS_SERVER": "127.0.0.1:18000", "FLOODGATE_XDS_NODE_ID": "gw", "FLOODGATE_XDS_TLS": "true"},
			check: func(t *testing.T, s *xdsSetup) {
				if s.opts.NodeID != "gw" || s.opts.TLS == nil || s.opts.TLS().ServerName != "127.0.0.1" {
					t.Errorf("options %+v", s.opts)
				}
			}},
		{name: "defaults", args: []string{"--xds-server", "xds:18000"}, check: func(t *testing.T, s *xdsSetup) {
			if s.opts.NodeID != "default" || s.opts.MaxMsgSize != 4<<20 || s.opts.MergeDomains {
				t.Errorf("options %+v", s.opts)
			}
		}},
		{name: "with --config", args: []string{"--xds-server", "xds:18000", "--config", "examples/rules.yaml"}, wantErr: "--config and --xds-server both give the Envoy domains"},
		{name: "tls without server", args: []string{"--xds-tls-ca", "ca.pem"}, wantErr: "--xds-* flags need --xds-server"},
		{name: "empty node", args: []string{"--xds-server", "xds:18000", "--xds-node-id", ""}, wantErr: "--xds-node-id ($FLOODGATE_XDS_NODE_ID) is empty"},
		{name: "bad metadata", args: []string{"--xds-server", "xds:18000", "--xds-node-metadata", "novalue"}, wantErr: `--xds-node-metadata ($FLOODGATE_XDS_NODE_METADATA): "novalue" is not key=value`},
		{name: "metadata twice", args: []string{"--xds-server", "xds:18000", "--xds-node-metadata", "a=1,a=2"}, wantErr: `"a" is given twice`},
		{name: "bad header", args: []string{"--xds-server", "xds:18000", "--xds-headers", "a b=1"}, wantErr: `"a b" is not a header name`},
		{name: "backoff", args: []string{"--xds-server", "xds:18000", "--xds-backoff-min", "10s", "--xds-backoff-max", "1s"}, wantErr: "--xds-backoff-min (10s) must be positive and at most --xds-backoff-max (1s)"},
		{name: "size", args: []string{"--xds-server", "xds:18000", "--xds-max-msg-size", "lots"}, wantErr: `--xds-max-msg-size ($FLOODGATE_XDS_MAX_MSG_SIZE): "lots" is not a size`},
		{name: "missing ca", args: []string{"--xds-server", "xds:18000", "--xds-tls-ca", "/nonexistent/ca.pem"}, wantErr: "--xds-tls-*: TLS CA: open /nonexistent/ca.pem"},
		{name: "cert without key", args: []string{"--xds-server", "xds:18000", "--xds-tls-cert", "c.pem"}, wantErr: "needs both a certificate and a key file"},
		{name: "tls, no port", args: []string{"--xds-server", "xds", "--xds-tls"}, wantErr: `--xds-server "xds": address xds: missing port`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for k, v := range tc.env {
				t.Setenv(k, v)
			}
			f, code, ok := parseServeFlags(tc.args, io.Discard)
			if !ok {
				t.Fatalf("flags refused, exit status %d", code)
			}
			s, err := f.xds.check(f.config, f.mergeDomains)
			switch {
			case tc.wantErr == "" && err != nil:
				t.Fatal(err)
			case tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)):
				t.Fatalf("got %v, want an error containing %q", err, tc.wantErr)
			}
			if tc.check != nil {
				tc.check(t, s)
			}
		})
	}
	// serve exits 2 with the message.
	var stderr bytes.Buffer
	if code := serveCmd(t.Context(), []string{"--xds-server", "xds:1", "--config", "x.yaml"}, io.Discard, &stderr, nil); code != 2 || !strings.Contains(stderr.String(), "--config and --xds-server") {
		t.Errorf("serve: exit %d, %s", code, stderr.String())
	}
}

// TestServeXDS runs floodgate serve against go-control-plane's management
// server over mutual TLS: serve waits for the first configuration before
// it listens, answers by it, takes an update with the counters kept,
// NACKs a bad one with its reason and keeps the one before, and shows
// it all in its metrics.
func TestServeXDS(t *testing.T) {
	files := tlstest.NewCA(t).Write(t, t.TempDir(), 2)
	serverTLS := tlstest.ClientConfig(t, files, false) // its pool is the CA: for the clients' certificates
	cert, err := tls.LoadX509KeyPair(files.Cert, files.Key)
	if err != nil {
		t.Fatal(err)
	}
	m := xdstest.Start(t, xdstest.Options{Node: "gw-1", TLS: &tls.Config{
		Certificates: []tls.Certificate{cert}, ClientCAs: serverTLS.RootCAs, ClientAuth: tls.RequireAndVerifyClientCert, MinVersion: tls.VersionTLS12,
	}})
	edge := func(rpu uint32) *rlsconf.RateLimitConfig {
		return &rlsconf.RateLimitConfig{Name: "edge", Domain: "edge", Descriptors: []*rlsconf.RateLimitDescriptor{
			{Key: "remote_address", RateLimit: &rlsconf.RateLimitPolicy{Unit: rlsconf.RateLimitUnit_HOUR, RequestsPerUnit: rpu}},
		}}
	}
	// The first snapshot is set only once serve has subscribed: it waits.
	subscribed := make(chan struct{})
	go func() {
		defer close(subscribed)
		m.Subscription()
		m.Set("gw-1", "v1", edge(3))
	}()
	in := serve(t, "--grpc", "127.0.0.1:0", "--xds-server", m.Addr, "--xds-node-id", "gw-1",
		"--xds-tls-ca", files.CA, "--xds-tls-cert", files.ClientCert, "--xds-tls-key", files.ClientKey)
	<-subscribed
	if !strings.Contains(in.stderr.String(), "waiting for the first configuration from the xDS server") ||
		!strings.Contains(in.stdout.String(), "envoy domains: 1 from xDS server "+m.Addr+" (node gw-1)") {
		t.Fatalf("serve did not wait for its first configuration:\n%s\n%s", in.stdout, in.stderr)
	}
	ask := askEdge(t, in.grpcAddr)
	if st := ask(); st.CurrentLimit.GetRequestsPerUnit() != 3 || st.LimitRemaining != 2 {
		t.Fatalf("first answer %v", st)
	}
	ask()

	m.Set("gw-1", "v2", edge(10))
	waitFor(t, "v2", func() bool { return strings.Contains(in.metrics(t), "floodgate_xds_applied_total 2") })
	if st := ask(); st.CurrentLimit.GetRequestsPerUnit() != 10 || st.LimitRemaining != 7 {
		t.Fatalf("answer under v2 %v, want 7 left: 3 hits", st)
	}

	bad := edge(10)
	bad.Descriptors[0].RateLimit.Unit = 9
	m.Set("gw-1", "v3", bad)
	if a := m.NACK(); !strings.Contains(a.GetErrorDetail().GetMessage(), "descriptors[0].rate_limit.unit: invalid rate limit unit '9'") || a.GetVersionInfo() != "v2" {
		t.Fatalf("NACK %v", a)
	}
	waitFor(t, "the NACK in the metrics", func() bool { return strings.Contains(in.metrics(t), "floodgate_xds_rejected_total 1") })
	if st := ask(); st.CurrentLimit.GetRequestsPerUnit() != 10 || st.LimitRemaining != 6 {
		t.Fatalf("answer after the NACK %v, want v2's limit, 6 left", st)
	}
	met := in.metrics(t)
	for _, want := range []string{"floodgate_xds_connected 1", `floodgate_config_reloads_total{result="failure"} 1`, `floodgate_config_reloads_total{result="success"} 2`} {
		if !strings.Contains(met, want) {
			t.Errorf("metrics lack %q", want)
		}
	}
	if !strings.Contains(in.stderr.String(), "xDS configuration refused (NACK)") {
		t.Errorf("no log of the NACK:\n%s", in.stderr)
	}
}

// TestServeXDSStartWithoutConfig: with --xds-start-without-config (Envoy
// Gateway's FORCE_START_WITHOUT_INITIAL_CONFIG=true), serve listens at
// once and fails Envoy's requests as envoyproxy/ratelimit does until the
// first configuration comes; health checks pass meanwhile.
func TestServeXDSStartWithoutConfig(t *testing.T) {
	m := xdstest.Start(t, xdstest.Options{Node: "gw"})
	in := serve(t, "--grpc", "127.0.0.1:0", "--xds-server", m.Addr, "--xds-node-id", "gw", "--xds-start-without-config")
	if !strings.Contains(in.stdout.String(), "envoy domains: 0 from xDS server") {
		t.Fatalf("banner:\n%s", in.stdout)
	}
	conn := envoytest.Dial(t, in.grpcAddr)
	c := rlsv3.NewRateLimitServiceClient(conn)
	req := envoytest.Request("edge", envoytest.Descriptor("remote_address", "203.0.113.7"))
	_, err := c.ShouldRateLimit(context.Background(), req)
	if status.Code(err) != codes.Unknown || !strings.Contains(err.Error(), "no rate limit configuration loaded") {
		t.Fatalf("before the first configuration: %v", err)
	}
	if h, err := healthpb.NewHealthClient(conn).Check(context.Background(), &healthpb.HealthCheckRequest{}); err != nil || h.Status != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("health before the first configuration: %v, %v", h, err)
	}
	body := `{"domain":"edge","descriptors":[{"entries":[{"key":"remote_address","value":"203.0.113.7"}]}]}`
	if code, resp := in.post(t, "/json", body); code != 400 || !strings.Contains(resp["detail"].(string), "no rate limit configuration loaded") {
		t.Fatalf("/json before the first configuration: %d %v", code, resp)
	}

	m.Set("gw", "v1", &rlsconf.RateLimitConfig{Name: "edge", Domain: "edge", Descriptors: []*rlsconf.RateLimitDescriptor{
		{Key: "remote_address", RateLimit: &rlsconf.RateLimitPolicy{Unit: rlsconf.RateLimitUnit_HOUR, RequestsPerUnit: 3}},
	}})
	waitFor(t, "the first configuration", func() bool {
		resp, err := c.ShouldRateLimit(context.Background(), req)
		return err == nil && resp.Statuses[0].CurrentLimit.GetRequestsPerUnit() == 3
	})
	if code, resp := in.post(t, "/json", body); code != 200 || resp["overallCode"] != "OK" {
		t.Fatalf("/json after the first configuration: %d %v", code, resp)
	}
}

// TestRatelimitModeXDS: started as ratelimit with Envoy Gateway's
// CONFIG_TYPE=GRPC_XDS_SOTW and FORCE_START_WITHOUT_INITIAL_CONFIG (and
// the image's FLOODGATE_CONFIG, which the xDS setting overrides), floodgate
// serves before the first configuration, then takes the domains from the
// xDS server.
func TestRatelimitModeXDS(t *testing.T) {
	m := xdstest.Start(t, xdstest.Options{Node: "envoy-ratelimit"})
	in := startRatelimit(t, t.TempDir(), "CONFIG_TYPE=GRPC_XDS_SOTW", "CONFIG_GRPC_XDS_SERVER_URL="+m.Addr,
		"CONFIG_GRPC_XDS_NODE_ID=envoy-ratelimit", "FORCE_START_WITHOUT_INITIAL_CONFIG=true",
		"XDS_CLIENT_BACKOFF_INITIAL_INTERVAL=100ms", "XDS_CLIENT_BACKOFF_MAX_INTERVAL=1s",
		"USE_STATSD=false", "FLOODGATE_REDIS=", "FLOODGATE_CONFIG=/etc/floodgate/rules.yaml")
	c := envoytest.Client(t, in.grpc)
	req := envoytest.Request("edge", envoytest.Descriptor("remote_address", "203.0.113.7"))
	if _, err := c.ShouldRateLimit(context.Background(), req); status.Code(err) != codes.Unknown {
		t.Fatalf("before the first configuration: %v, want Unknown", err)
	}
	m.Set("envoy-ratelimit", "v1", &rlsconf.RateLimitConfig{Name: "edge", Domain: "edge", Descriptors: []*rlsconf.RateLimitDescriptor{
		{Key: "remote_address", RateLimit: &rlsconf.RateLimitPolicy{Unit: rlsconf.RateLimitUnit_HOUR, RequestsPerUnit: 2}},
	}})
	waitFor(t, "the first configuration", func() bool {
		resp, err := c.ShouldRateLimit(context.Background(), req)
		return err == nil && resp.Statuses[0].CurrentLimit.GetRequestsPerUnit() == 2
	})
	// waitFor's answer was the first hit of 2.
	for i, want := range []rlsv3.RateLimitResponse_Code{rlsv3.RateLimitResponse_OK, rlsv3.RateLimitResponse_OVER_LIMIT} {
		resp, err := c.ShouldRateLimit(context.Background(), req)
		if err != nil || resp.OverallCode != want {
			t.Fatalf("request %d: %v, %v; want %v", i+2, resp, err, want)
		}
	}
}
