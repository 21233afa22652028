package envoy_test

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rls "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"

	"github.com/floodgate/floodgate"
	"github.com/floodgate/floodgate/fallback"
	"github.com/floodgate/floodgate/internal/server/config"
	"github.com/floodgate/floodgate/internal/server/envoy"
	"github.com/floodgate/floodgate/internal/server/service"
	"github.com/floodgate/floodgate/internal/testkit/envoytest"
	"github.com/floodgate/floodgate/internal/testkit/redistest"
	"github.com/floodgate/floodgate/redisstore"
	"github.com/floodgate/floodgate/storetest"
)

// shopDomain has nested descriptors with a wildcard, a limit that
// replaces another, shadow mode, quota mode, a bucket, an unlimited and a
// blocked descriptor.
const shopDomain = `domain: shop
descriptors:
  - key: tenant
    value: acme
    descriptors:
      - key: path
        value: /api/*
        rate_limit: {unit: minute, requests_per_unit: 2}
      - key: user
        rate_limit: {unit: minute, requests_per_unit: 5, name: per-user}
  - key: user
    value: vip
    rate_limit: {unit: minute, requests_per_unit: 100, name: vip, replaces: [{name: per-user}]}
  - key: ip
    shadow_mode: true
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: plan
    quota_mode: true
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: bucket
    rate_limit: {unit: second, requests_per_unit: 1, algorithm: token-bucket, burst: 2}
  - key: free
    rate_limit: {unlimited: true}
  - key: blocked
    rate_limit: {unit: hour, requests_per_unit: 0}
`

// newShop is a Service of shopDomain over store, on clock's time.
func newShop(t *testing.T, store floodgate.Store, fb *fallback.Store, now time.Time) *envoy.Service {
	t.Helper()
	cfg, err := config.Parse("shop.yaml", []byte(shopDomain))
	if err != nil {
		t.Fatal(err)
	}
	svc, err := envoy.New(store, cfg, &service.Options{Fallback: fb, Logger: slog.New(slog.DiscardHandler)}, &envoy.Options{Now: func() time.Time { return now }})
	if err != nil {
		t.Fatal(err)
	}
	return svc
}

func carrying(rpu uint32, kv ...string) *rlcommon.RateLimitDescriptor {
	d := envoytest.Descriptor(kv...)
	d.Limit = &rlcommon.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: rpu, Unit: typev3.RateLimitUnit_MINUTE}
	return d
}

// want is a descriptor's expected explanation, in short.
type want struct {
	matched    string // each step's Matched, space-separated
	descriptor string
	code       string
	remaining  int64 // -1: no state
	quota      int64
	replacedBy []int
	why        string // a part of its sentences
}

// Explain, case by case, on the memory store and on Redis behind the
// fallback: what each descriptor matched and why, its limit's state, and
// the answer now; then ShouldRateLimit itself gives that answer.
func TestExplainEnvoy(t *testing.T) {
	now := storetest.Base.Add(10 * time.Second)
	tests := []struct {
		name    string
		before  int // ShouldRateLimit calls of the request first
		req     *rls.RateLimitRequest
		overall string
		want    []want
		why     string
	}{
		{name: "nested-wildcard", before: 2,
			req: envoytest.Request("shop", envoytest.Descriptor("tenant", "acme", "path", "/api/orders")), overall: "OVER_LIMIT",
			want: []want{{matched: "value wildcard", descriptor: "shop.tenant_acme.path_/api/*", code: "OVER_LIMIT", remaining: 0, quota: 2,
				why: `entry 1 (path=/api/orders) matched descriptor shop.tenant_acme.path_/api/* by the wildcard value "/api/*"`}},
			why: "descriptor 0 is over its limit"},
		{name: "nested-key", before: 1,
			req: envoytest.Request("shop", envoytest.Descriptor("tenant", "acme", "user", "bob")), overall: "OK",
			want: []want{{matched: "value key", descriptor: "shop.tenant_acme.user", code: "OK", remaining: 4, quota: 5, why: "matched descriptor shop.tenant_acme.user by its key, which takes any value"}}},
		{name: "replaces", before: 0,
			req: envoytest.Request("shop", envoytest.Descriptor("tenant", "acme", "user", "bob"), envoytest.Descriptor("user", "vip")), overall: "OK",
			want: []want{
				{matched: "value key", descriptor: "shop.tenant_acme.user", code: "OK", remaining: -1, replacedBy: []int{1}, why: `its limit "per-user" is replaced by the limit of descriptor 1 of the request (replaces)`},
				{matched: "value", descriptor: "shop.user_vip", code: "OK", remaining: 100, quota: 100},
			}},
		{name: "shadow", before: 1,
			req: envoytest.Request("shop", envoytest.Descriptor("ip", "10.0.0.1")), overall: "OK",
			want: []want{{matched: "key", descriptor: "shop.ip", code: "OK", remaining: 0, quota: 1, why: "shadow_mode: it is over the limit, which is counted but never denies"}}},
		{name: "quota-mode", before: 1,
			req: envoytest.Request("shop", envoytest.Descriptor("plan", "gold")), overall: "OVER_LIMIT",
			want: []want{{matched: "key", descriptor: "shop.plan", code: "OVER_LIMIT", remaining: 0, quota: 1, why: "quota_mode"}}},
		{name: "bucket", before: 2,
			req: envoytest.Request("shop", envoytest.Descriptor("bucket", "b")), overall: "OVER_LIMIT",
			want: []want{{matched: "key", descriptor: "shop.bucket", code: "OVER_LIMIT", remaining: 0, quota: 2}}},
		{name: "unlimited",
			req: envoytest.Request("shop", envoytest.Descriptor("free", "x")), overall: "OK",
			want: []want{{matched: "key", descriptor: "shop.free", code: "OK", remaining: -1, why: "unlimited"}}},
		{name: "blocked",
			req: envoytest.Request("shop", envoytest.Descriptor("blocked", "x")), overall: "OVER_LIMIT",
			want: []want{{matched: "key", descriptor: "shop.blocked", code: "OVER_LIMIT", remaining: -1, why: "requests_per_unit is 0"}}},
		{name: "no-match",
			req: envoytest.Request("shop", envoytest.Descriptor("tenant", "other"), envoytest.Descriptor("tenant", "acme"), envoytest.Descriptor("tenant", "acme", "user", "bob", "x", "y")), overall: "OK",
			want: []want{
				{matched: "none", code: "OK", remaining: -1, why: "matched no descriptor at its level"},
				{matched: "value", code: "OK", remaining: -1, why: "has no rate_limit of its own"},
				{matched: "value key", code: "OK", remaining: -1, why: "a limit applies only to a descriptor's last entry"},
			}},
		{name: "carried-limit", before: 1,
			req: envoytest.Request("shop", carrying(1, "anything", "x")), overall: "OVER_LIMIT",
			want: []want{{code: "OVER_LIMIT", remaining: 0, quota: 1, why: "the descriptor carries its own limit, 1 per minute"}}},
		{name: "unknown-domain",
			req: envoytest.Request("nope", envoytest.Descriptor("ip", "1")), overall: "OK",
			want: []want{{code: "OK", remaining: -1, why: `no domain "nope" is configured`}}},
	}
	stores := []struct {
		name string
		make func(t *testing.T, clock floodgate.Clock) (floodgate.Store, *fallback.Store)
	}{
		{"memory", func(t *testing.T, clock floodgate.Clock) (floodgate.Store, *fallback.Store) {
			st := floodgate.NewMemoryStore(&floodgate.MemoryOptions{Clock: clock, SweepInterval: -1})
			t.Cleanup(func() { st.Close() })
			return st, nil
		}},
	}
	{
		srv := redistest.Start(t)
		n := 0
		stores = append(stores, struct {
			name string
			make func(t *testing.T, clock floodgate.Clock) (floodgate.Store, *fallback.Store)
		}{"redis", func(t *testing.T, clock floodgate.Clock) (floodgate.Store, *fallback.Store) {
			n++
			rs := redisstore.New(srv.Client(t), &redisstore.Options{Clock: clock, Prefix: "x" + string(rune('a'+n)) + ":"})
			t.Cleanup(func() { rs.Close() })
			fb := fallback.New(rs, &fallback.Options{Clock: clock, Budget: -1, Logger: slog.New(slog.DiscardHandler)}) // Redis answers every call, however loaded the machine
			t.Cleanup(func() { fb.Close() })
			return fb, fb
		}})
	}
	ctx := context.Background()
	for _, store := range stores {
		for _, tt := range tests {
			t.Run(store.name+"/"+tt.name, func(t *testing.T) {
				st, fb := store.make(t, storetest.NewClock(now))
				svc := newShop(t, st, fb, now)
				for range tt.before {
					if _, err := svc.ShouldRateLimit(ctx, tt.req); err != nil {
						t.Fatal(err)
					}
				}
				e, err := svc.Explain(ctx, tt.req)
				if err != nil {
					t.Fatal(err)
				}
				if e.OverallCode != tt.overall || len(e.Descriptors) != len(tt.want) || !strings.Contains(strings.Join(e.Why, "\n"), tt.why) {
					t.Fatalf("overall %s, %d descriptors, why %q; want %s, %d, %q", e.OverallCode, len(e.Descriptors), e.Why, tt.overall, len(tt.want), tt.why)
				}
				for i, w := range tt.want {
					d := e.Descriptors[i]
					var matched []string
					for _, s := range d.Match {
						matched = append(matched, s.Matched)
					}
					remaining, quota := int64(-1), int64(0)
					if d.State != nil {
						remaining, quota = d.State.Remaining, d.State.Quota
					}
					if strings.Join(matched, " ") != w.matched || d.Descriptor != w.descriptor || d.Code != w.code || remaining != w.remaining || (remaining >= 0 && quota != w.quota) ||
						!slices.Equal(d.ReplacedBy, w.replacedBy) || !strings.Contains(strings.Join(d.Why, "\n"), w.why) {
						t.Errorf("descriptor %d: %+v (state %+v)\nwhy %q\nwant %+v", i, d, d.State, d.Why, w)
					}
					if d.State != nil && (d.Store == nil || d.Store.Name != store.name || (store.name == "redis") != (d.Store.Fallback != nil)) {
						t.Errorf("descriptor %d: store %+v; want %s", i, d.Store, store.name)
					}
				}
				// Explaining charged nothing, and the answer is the one
				// explained.
				again, err := svc.Explain(ctx, tt.req)
				if err != nil {
					t.Fatal(err)
				}
				resp, err := svc.ShouldRateLimit(ctx, tt.req)
				if err != nil {
					t.Fatal(err)
				}
				if got := resp.OverallCode.String(); got != again.OverallCode {
					t.Errorf("ShouldRateLimit says %s; Explain said %s", got, again.OverallCode)
				}
				for i, s := range resp.Statuses {
					if got := s.Code.String(); got != again.Descriptors[i].Code {
						t.Errorf("descriptor %d: ShouldRateLimit says %s; Explain said %s", i, got, again.Descriptors[i].Code)
					}
				}
			})
		}
	}
}

func TestExplainEnvoyBadInput(t *testing.T) {
	now := storetest.Base
	st := floodgate.NewMemoryStore(&floodgate.MemoryOptions{SweepInterval: -1})
	t.Cleanup(func() { st.Close() })
	svc := newShop(t, st, nil, now)
	many := make([]*rlcommon.RateLimitDescriptor, envoy.MaxExplainDescriptors+1)
	for i := range many {
		many[i] = envoytest.Descriptor("ip", "1")
	}
	h := svc.ExplainHandler(slog.New(slog.DiscardHandler))
	tests := []struct {
		name, body string
		status     int
		want       string
	}{
		{"malformed JSON", `{"domain": "shop", "descriptors": [`, 400, "not a RateLimitRequest in JSON"},
		{"unknown field", `{"domain": "shop", "nope": 1}`, 400, "not a RateLimitRequest in JSON"},
		{"empty domain", `{"descriptors": [{"entries": [{"key": "ip", "value": "1"}]}]}`, 400, "domain must not be empty"},
		{"no descriptors", `{"domain": "shop"}`, 400, "descriptor list must not be empty"},
		{"a carried limit with no unit", `{"domain": "shop", "descriptors": [{"entries": [{"key": "ip", "value": "1"}], "limit": {"requests_per_unit": 1}}]}`, 400, "no valid unit"},
		{"not UTF-8", "{\"domain\": \"sh\xffop\"}", 400, "UTF-8"},
		{"explained", `{"domain": "shop", "descriptors": [{"entries": [{"key": "tenant", "value": "acme"}, {"key": "path", "value": "/api/x"}]}]}`, 200, `"matched":"wildcard"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			w := httptest.NewRecorder()
			h.ServeHTTP(w, httptest.NewRequest("POST", "/v1/explain/envoy", strings.NewReader(tt.body)))
			if w.Code != tt.status || !strings.Contains(w.Body.String(), tt.want) {
				t.Errorf("%d %s; want %d with %s", w.Code, w.Body.String(), tt.status, tt.want)
			}
			if w.Code == 200 {
				var e envoy.Explanation
				if err := json.Unmarshal(w.Body.Bytes(), &e); err != nil || e.OverallCode != "OK" {
					t.Errorf("%+v, %v", e, err)
				}
			}
		})
	}
	if _, err := svc.Explain(context.Background(), envoytest.Request("shop", many...)); !errors.Is(err, service.ErrBadRequest) || !strings.Contains(err.Error(), "more than the 64") {
		t.Errorf("%d descriptors: %v", len(many), err)
	}
}
