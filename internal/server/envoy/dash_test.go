package envoy_test

import (
	"context"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/floodgate/floodgate"
	"github.com/floodgate/floodgate/internal/server/config"
	"github.com/floodgate/floodgate/internal/server/dash"
	"github.com/floodgate/floodgate/internal/server/envoy"
	"github.com/floodgate/floodgate/internal/server/service"
	"github.com/floodgate/floodgate/internal/testkit/envoytest"
)

// TestDashboardSeesEnvoy: Envoy's denials, over gRPC and over /json, are
// in the dashboard's top keys as rule "envoy:<domain>" and key
// "key=value,...", and its domains are beside the rules. Before, the
// dashboard heard only the rules' denials and listed no domains.
func TestDashboardSeesEnvoy(t *testing.T) {
	st := floodgate.NewMemoryStore(&floodgate.MemoryOptions{SweepInterval: -1})
	defer st.Close()
	cfg, err := config.Parse("web.yaml", []byte("domain: web\ndescriptors:\n  - key: ip\n    rate_limit: {unit: hour, requests_per_unit: 1}\n    descriptors:\n      - key: path\n        rate_limit: {unit: hour, requests_per_unit: 5}\n  - key: free\n"))
	if err != nil {
		t.Fatal(err)
	}
	var board *dash.Dashboard
	svc, err := envoy.New(st, cfg, &service.Options{Logger: slog.New(slog.DiscardHandler),
		OnDenied: func(rule, key string) { board.Denied(rule, key) }}, nil)
	if err != nil {
		t.Fatal(err)
	}
	board = dash.New(svc.Rules(), &dash.Options{Step: time.Hour, Domains: func() []dash.Domain {
		var out []dash.Domain
		for _, d := range svc.Domains() {
			out = append(out, dash.Domain(d))
		}
		return out
	}})
	defer board.Close()

	addr, _ := startGRPC(t, svc)
	rls := envoytest.Client(t, addr)
	js := httptest.NewServer(svc.JSONHandler(slog.New(slog.DiscardHandler)))
	defer js.Close()

	ctx := context.Background()
	grpcReq := func(es ...string) rlsv3.RateLimitResponse_Code {
		r, err := rls.ShouldRateLimit(ctx, envoytest.Request("web", envoytest.Descriptor(es...)))
		if err != nil {
			t.Fatal(err)
		}
		return r.OverallCode
	}
	jsonReq := func(es ...string) int {
		var b strings.Builder
		for i := 0; i < len(es); i += 2 {
			if i > 0 {
				b.WriteByte(',')
			}
			b.WriteString(`{"key":"` + es[i] + `","value":"` + es[i+1] + `"}`)
		}
		r, err := http.Post(js.URL, "application/json", strings.NewReader(`{"domain":"web","descriptors":[{"entries":[`+b.String()+`]}]}`))
		if err != nil {
			t.Fatal(err)
		}
		r.Body.Close()
		return r.StatusCode
	}
	steps := []struct {
		name string
		do   func() bool // reports whether the answer was as expected
	}{
		{"gRPC ip=a allowed", func() bool { return grpcReq("ip", "a") == rlsv3.RateLimitResponse_OK }},
		{"gRPC ip=a denied", func() bool { return grpcReq("ip", "a") == rlsv3.RateLimitResponse_OVER_LIMIT }},
		{"gRPC ip=a denied again", func() bool { return grpcReq("ip", "a") == rlsv3.RateLimitResponse_OVER_LIMIT }},
		{"/json ip=b,path=/x allowed", func() bool { return jsonReq("ip", "b", "path", "/x") == http.StatusOK }},
		{"/json ip=b allowed", func() bool { return jsonReq("ip", "b") == http.StatusOK }}, // its own counter
		{"/json ip=b denied", func() bool { return jsonReq("ip", "b") == http.StatusTooManyRequests }},
		{"unlimited free=1 allowed", func() bool { return grpcReq("free", "1") == rlsv3.RateLimitResponse_OK }},
	}
	for _, s := range steps {
		if !s.do() {
			t.Fatalf("%s: unexpected answer", s.name)
		}
	}

	snap := board.Snapshot()
	got := map[string]uint64{}
	for _, k := range snap.Top["envoy:web"] {
		got[k.Key] = k.Count
	}
	want := map[string]uint64{"ip=a": 2, "ip=b": 1}
	if len(got) != len(want) || got["ip=a"] != want["ip=a"] || got["ip=b"] != want["ip=b"] {
		t.Errorf("top keys of envoy:web %v, want %v (all: %+v)", got, want, snap.Top)
	}
	if len(snap.Domains) != 1 {
		t.Fatalf("domains %+v, want web", snap.Domains)
	}
	// Hits: ip=a 3, ip=b,path=/x 1, ip=b 2; over the limit: 2 of ip=a, 1 of ip=b.
	if d := snap.Domains[0]; d != (dash.Domain{Name: "web", Descriptors: 2, Hits: 6, OverLimit: 3}) {
		t.Errorf("domain %+v, want web with 2 descriptors, 6 hits, 3 over the limit", d)
	}
}
