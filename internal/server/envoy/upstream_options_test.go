package envoy_test

import (
	"context"
	"net"
	"slices"
	"strings"
	"testing"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rls "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/floodgate/floodgate"
	"github.com/floodgate/floodgate/internal/server/envoy"
	"github.com/floodgate/floodgate/internal/server/statsd"
	"github.com/floodgate/floodgate/internal/testkit/envoytest"
	"github.com/floodgate/floodgate/internal/testkit/peertest"
	"github.com/floodgate/floodgate/storetest"
)

// ask sends one request of the descriptors ds in domain web.
func ask(t *testing.T, svc *envoy.Service, ds ...*rlcommon.RateLimitDescriptor) *rls.RateLimitResponse {
	t.Helper()
	resp, err := svc.ShouldRateLimit(context.Background(), &rls.RateLimitRequest{Domain: "web", Descriptors: ds})
	if err != nil {
		t.Fatal(err)
	}
	return resp
}

// TestGlobalModes: SHADOW_MODE answers OK overall while the statuses say
// OVER_LIMIT, and counts it; QUOTA_MODE makes every descriptor a
// quota_mode one, so that a request passes while any has room.
func TestGlobalModes(t *testing.T) {
	for _, tc := range []struct {
		name  string
		o     envoy.Options
		ds    func() []*rlcommon.RateLimitDescriptor
		codes []rls.RateLimitResponse_Code // the overall code of three requests
	}{
		{name: "default", ds: func() []*rlcommon.RateLimitDescriptor {
			return []*rlcommon.RateLimitDescriptor{envoytest.Descriptor("ip", "a")}
		},
			codes: []rls.RateLimitResponse_Code{rls.RateLimitResponse_OK, rls.RateLimitResponse_OK, rls.RateLimitResponse_OVER_LIMIT}},
		{name: "shadow", o: envoy.Options{GlobalShadowMode: true}, ds: func() []*rlcommon.RateLimitDescriptor {
			return []*rlcommon.RateLimitDescriptor{envoytest.Descriptor("ip", "a")}
		},
			codes: []rls.RateLimitResponse_Code{rls.RateLimitResponse_OK, rls.RateLimitResponse_OK, rls.RateLimitResponse_OK}},
		{name: "quota", o: envoy.Options{GlobalQuotaMode: true},
			ds: func() []*rlcommon.RateLimitDescriptor {
				return []*rlcommon.RateLimitDescriptor{envoytest.Descriptor("ip", "a"), envoytest.Descriptor("blocked", "x")}
			},
			// blocked is always over; ip has room twice.
			codes: []rls.RateLimitResponse_Code{rls.RateLimitResponse_OK, rls.RateLimitResponse_OK, rls.RateLimitResponse_OVER_LIMIT}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			svc := newEnvoy(t, tc.o)
			for i, want := range tc.codes {
				resp := ask(t, svc, tc.ds()...)
				if resp.OverallCode != want {
					t.Errorf("request %d: %v, want %v", i, resp, want)
				}
				if tc.name == "shadow" && i == 2 && resp.Statuses[0].Code != rls.RateLimitResponse_OVER_LIMIT {
					t.Errorf("shadow mode changed the status: %v", resp.Statuses[0])
				}
			}
			var b strings.Builder
			svc.Rules().Metrics.Write(&b)
			has := strings.Contains(b.String(), "ratelimit_service_global_shadow_mode 1")
			if has != (tc.name == "shadow") {
				t.Errorf("ratelimit_service_global_shadow_mode 1 on /metrics: %v\n%s", has, b.String())
			}
		})
	}
}

// TestNearLimitRatioAndHeaderNames: NEAR_LIMIT_RATIO moves near_limit's
// threshold; LIMIT_*_HEADER rename the headers; bad values are refused.
func TestNearLimitRatioAndHeaderNames(t *testing.T) {
	svc := newEnvoy(t, envoy.Options{NearLimitRatio: 0.5, RateLimitHeaders: true, HeaderNames: [3]string{"X-Limit", "", "X-Reset"}})
	resp := ask(t, svc, envoytest.Descriptor("ip", "a"))
	var hs []string
	for _, h := range resp.ResponseHeadersToAdd {
		hs = append(hs, h.Key+": "+h.Value)
	}
	if want := "X-Limit: 2, RateLimit-Remaining: 1, X-Reset: 50"; strings.Join(hs, ", ") != want {
		t.Errorf("headers %q, want %q", strings.Join(hs, ", "), want)
	}
	var b strings.Builder
	svc.Rules().Metrics.Write(&b)
	// 2 a minute at 0.5: near above floor(2*0.5) = 1, so the first hit
	// (count 1) is not near, the second (count 2) is.
	if strings.Contains(b.String(), `ratelimit_service_rate_limit_near_limit{domain="web",key1="ip"`) {
		t.Errorf("near_limit counted at the first hit:\n%s", b.String())
	}
	ask(t, svc, envoytest.Descriptor("ip", "a"))
	b.Reset()
	svc.Rules().Metrics.Write(&b)
	if !strings.Contains(b.String(), `ratelimit_service_rate_limit_near_limit{domain="web",key1="ip",key2=""} 1`) {
		t.Errorf("near_limit not counted at the second hit at ratio 0.5:\n%s", b.String())
	}
	for _, o := range []envoy.Options{{NearLimitRatio: 1.5}, {NearLimitRatio: -0.1}, {HeaderNames: [3]string{"Bad Header"}}} {
		if _, err := envoy.New(nil, nil, nil, &o); err == nil {
			t.Errorf("options %+v accepted", o)
		}
	}
}

// TestStatsDNames: the per-descriptor statistics reach StatsD under
// envoyproxy/ratelimit's whole names (every part of a nested descriptor,
// an IPv4 address's dots as _), with the service's and the gRPC server's.
func TestStatsDNames(t *testing.T) {
	l, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	sink, err := statsd.New(statsd.Options{Addr: l.LocalAddr().String(), FlushInterval: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	defer sink.Close()
	svc := newEnvoyDomain(t, envoy.Options{StatsD: sink}, `domain: web
descriptors:
  - key: path
    value: /login
    descriptors:
      - key: remote_address
        detailed_metric: true
        rate_limit: {unit: minute, requests_per_unit: 1}
`)
	addr, _ := startGRPC(t, svc)
	c := peertest.Client(t, addr)
	for range 3 {
		if _, err := c.ShouldRateLimit(context.Background(), envoytest.Request("web", envoytest.Descriptor("path", "/login", "remote_address", "10.1.2.3"))); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := c.ShouldRateLimit(context.Background(), envoytest.Request("")); err == nil {
		t.Fatal("an empty request was answered")
	}
	sink.Flush()
	want := []string{
		"ratelimit.service.config_load_success:1|c",
		"ratelimit.service.call.should_rate_limit.service_error:1|c",
		"ratelimit.service.rate_limit.web.path_/login.remote_address_10_1_2_3.over_limit:2|c",
		"ratelimit.service.rate_limit.web.path_/login.remote_address_10_1_2_3.total_hits:3|c",
		"ratelimit.service.rate_limit.web.path_/login.remote_address_10_1_2_3.within_limit:1|c",
		"ratelimit.service.rate_limit.web.path_/login.remote_address_10_1_2_3.near_limit:1|c",
		"ratelimit_server.ShouldRateLimit.total_requests:4|c",
	}
	var got []string
	buf := make([]byte, 65536)
	l.SetReadDeadline(time.Now().Add(5 * time.Second))
	for !containsAll(got, want) {
		n, err := l.Read(buf)
		if err != nil {
			t.Fatalf("StatsD lines %q, want %q among them: %v", got, want, err)
		}
		got = append(got, strings.Split(strings.TrimSpace(string(buf[:n])), "\n")...)
	}
}

func containsAll(have, want []string) bool {
	for _, w := range want {
		if !slices.Contains(have, w) {
			return false
		}
	}
	return true
}

// newEnvoyDomain is newEnvoy with the domain file domain, on the same
// fixed clock.
func newEnvoyDomain(t *testing.T, opts envoy.Options, domain string) *envoy.Service {
	t.Helper()
	now := storetest.Base.Add(10 * time.Second)
	opts.Now = func() time.Time { return now }
	st := floodgate.NewMemoryStore(&floodgate.MemoryOptions{Clock: storetest.NewClock(now), SweepInterval: -1})
	t.Cleanup(func() { st.Close() })
	return newEnvoyOn(t, st, "web.yaml", domain, &opts)
}
