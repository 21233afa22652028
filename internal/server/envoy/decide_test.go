package envoy_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"strings"
	"testing"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rls "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/floodgate/floodgate"
	"github.com/floodgate/floodgate/internal/server/config"
	"github.com/floodgate/floodgate/internal/server/envoy"
	"github.com/floodgate/floodgate/internal/server/service"
	"github.com/floodgate/floodgate/internal/testkit/envoytest"
	"github.com/floodgate/floodgate/internal/testkit/redistest"
	"github.com/floodgate/floodgate/redisstore"
	"github.com/floodgate/floodgate/storetest"
)

const envoyDomain = `domain: web
descriptors:
  - key: ip
    rate_limit: {unit: minute, requests_per_unit: 2}
  - key: free
    rate_limit: {unlimited: true}
  - key: blocked
    rate_limit: {unit: hour, requests_per_unit: 0}
  - key: bucket
    rate_limit: {unit: second, requests_per_unit: 1, algorithm: token-bucket, burst: 3}
  - key: quota
    quota_mode: true
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: shadow
    shadow_mode: true
    rate_limit: {unit: minute, requests_per_unit: 1}
`

// newEnvoy is a Service of envoyDomain over a memory store on a fixed
// clock, at 10s past a minute, and its Envoy answers' clock at the same
// instant.
func newEnvoy(t *testing.T, opts envoy.Options) *envoy.Service {
	t.Helper()
	return newEnvoyDomain(t, opts, envoyDomain)
}

// newEnvoyOn is a Service of the domain file (named file) over st, with
// opts (nil: the defaults), its failures logged nowhere.
func newEnvoyOn(t testing.TB, st floodgate.Store, file, domain string, opts *envoy.Options) *envoy.Service {
	t.Helper()
	cfg, err := config.Parse(file, []byte(domain))
	if err != nil {
		t.Fatal(err)
	}
	svc, err := envoy.New(st, cfg, &service.Options{Logger: slog.New(slog.DiscardHandler)}, opts)
	if err != nil {
		t.Fatal(err)
	}
	return svc
}

// descStatus is a DescriptorStatus in short: code, limit, remaining, reset
// in seconds (-1: none).
type descStatus struct {
	over      bool
	rpu       uint32 // 0: no CurrentLimit
	remaining uint32
	reset     int64
}

func short(s *rls.RateLimitResponse_DescriptorStatus) descStatus {
	out := descStatus{over: s.Code == rls.RateLimitResponse_OVER_LIMIT, remaining: s.LimitRemaining, reset: -1}
	if s.CurrentLimit != nil {
		out.rpu = s.CurrentLimit.RequestsPerUnit
	}
	if s.DurationUntilReset != nil {
		out.reset = s.DurationUntilReset.Seconds
	}
	return out
}

func TestShouldRateLimit(t *testing.T) {
	long := strings.Repeat("x", floodgate.MaxKeyLen)
	minuteLeft := int64(60 - storetest.Base.Add(10*time.Second).Unix()%60)
	hourLeft := int64(3600 - storetest.Base.Add(10*time.Second).Unix()%3600)
	for _, tc := range []struct {
		name   string
		atomic bool
		reqs   []*rls.RateLimitRequest
		want   []descStatus // of the last request
		over   bool         // its overall code
	}{
		{name: "within", reqs: []*rls.RateLimitRequest{{Domain: "web", Descriptors: []*rlcommon.RateLimitDescriptor{envoytest.Descriptor("ip", "a")}}},
			want: []descStatus{{rpu: 2, remaining: 1, reset: minuteLeft}}},
		{name: "hits over the limit count", reqs: []*rls.RateLimitRequest{
			{Domain: "web", HitsAddend: 3, Descriptors: []*rlcommon.RateLimitDescriptor{envoytest.Descriptor("ip", "a")}},
			{Domain: "web", Descriptors: []*rlcommon.RateLimitDescriptor{envoytest.Descriptor("ip", "a")}}},
			want: []descStatus{{over: true, rpu: 2, reset: minuteLeft}}, over: true},
		{name: "no limit applies", reqs: []*rls.RateLimitRequest{{Domain: "web", Descriptors: []*rlcommon.RateLimitDescriptor{envoytest.Descriptor("nope", "a"), envoytest.Descriptor("ip", "a", "deeper", "b")}}},
			want: []descStatus{{reset: -1}, {reset: -1}}},
		{name: "unknown domain", reqs: []*rls.RateLimitRequest{{Domain: "other", Descriptors: []*rlcommon.RateLimitDescriptor{envoytest.Descriptor("ip", "a")}}},
			want: []descStatus{{reset: -1}}},
		{name: "unlimited", reqs: []*rls.RateLimitRequest{{Domain: "web", Descriptors: []*rlcommon.RateLimitDescriptor{envoytest.Descriptor("free", "a")}}},
			want: []descStatus{{remaining: math.MaxUint32, reset: -1}}},
		{name: "zero requests per unit", reqs: []*rls.RateLimitRequest{{Domain: "web", Descriptors: []*rlcommon.RateLimitDescriptor{envoytest.Descriptor("blocked", "a")}}},
			want: []descStatus{{over: true, rpu: 0, reset: hourLeft}}, over: true},
		{name: "floodgate's token bucket", reqs: []*rls.RateLimitRequest{{Domain: "web", Descriptors: []*rlcommon.RateLimitDescriptor{envoytest.Descriptor("bucket", "a")}}},
			want: []descStatus{{rpu: 1, remaining: 2, reset: 1}}},
		// quota_mode as envoyproxy/ratelimit answers it since March 2026:
		// the request is over when every quota of it is.
		{name: "quota mode: over when every quota is", reqs: []*rls.RateLimitRequest{
			{Domain: "web", Descriptors: []*rlcommon.RateLimitDescriptor{envoytest.Descriptor("quota", "a")}},
			{Domain: "web", Descriptors: []*rlcommon.RateLimitDescriptor{envoytest.Descriptor("quota", "a")}}},
			want: []descStatus{{over: true, rpu: 1, reset: minuteLeft}}, over: true},
		{name: "quota mode: passes while a quota has room", reqs: []*rls.RateLimitRequest{
			{Domain: "web", Descriptors: []*rlcommon.RateLimitDescriptor{envoytest.Descriptor("quota", "a")}},
			{Domain: "web", Descriptors: []*rlcommon.RateLimitDescriptor{envoytest.Descriptor("quota", "a"), envoytest.Descriptor("quota", "b")}}},
			want: []descStatus{{over: true, rpu: 1, reset: minuteLeft}, {rpu: 1, remaining: 0, reset: minuteLeft}}},
		{name: "quota mode: every quota over, the other limit within", reqs: []*rls.RateLimitRequest{
			{Domain: "web", Descriptors: []*rlcommon.RateLimitDescriptor{envoytest.Descriptor("quota", "a")}},
			{Domain: "web", Descriptors: []*rlcommon.RateLimitDescriptor{envoytest.Descriptor("ip", "a"), envoytest.Descriptor("quota", "a")}}},
			want: []descStatus{{rpu: 2, remaining: 1, reset: minuteLeft}, {over: true, rpu: 1, reset: minuteLeft}}, over: true},
		{name: "shadow mode", reqs: []*rls.RateLimitRequest{
			{Domain: "web", Descriptors: []*rlcommon.RateLimitDescriptor{envoytest.Descriptor("shadow", "a")}},
			{Domain: "web", Descriptors: []*rlcommon.RateLimitDescriptor{envoytest.Descriptor("shadow", "a")}}},
			want: []descStatus{{rpu: 1, reset: minuteLeft}}},
		{name: "descriptor hits_addend wins", reqs: []*rls.RateLimitRequest{{Domain: "web", HitsAddend: 2,
			Descriptors: []*rlcommon.RateLimitDescriptor{{Entries: envoytest.Descriptor("ip", "a").Entries, HitsAddend: wrapperspb.UInt64(1)}, envoytest.Descriptor("ip", "b")}}},
			want: []descStatus{{rpu: 2, remaining: 1, reset: minuteLeft}, {rpu: 2, remaining: 0, reset: minuteLeft}}},
		{name: "one counter twice, in order", reqs: []*rls.RateLimitRequest{{Domain: "web",
			Descriptors: []*rlcommon.RateLimitDescriptor{envoytest.Descriptor("ip", "a"), envoytest.Descriptor("ip", "a"), envoytest.Descriptor("bucket", "a")}}},
			want: []descStatus{{rpu: 2, remaining: 1, reset: minuteLeft}, {rpu: 2, remaining: 0, reset: minuteLeft}, {rpu: 1, remaining: 2, reset: 1}}},
		{name: "the descriptor's own limit", reqs: []*rls.RateLimitRequest{{Domain: "web",
			Descriptors: []*rlcommon.RateLimitDescriptor{{Entries: envoytest.Descriptor("ip", "a").Entries, Limit: &rlcommon.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 10, Unit: typev3.RateLimitUnit_HOUR}}}}},
			want: []descStatus{{rpu: 10, remaining: 9, reset: hourLeft}}},
		// Descriptors longer than a store key (floodgate.MaxKeyLen) are
		// counted like any other, apart from each other: a request must
		// not get past its limit by making its decision fail.
		{name: "a long value, twice", reqs: []*rls.RateLimitRequest{
			{Domain: "web", Descriptors: []*rlcommon.RateLimitDescriptor{envoytest.Descriptor("ip", long+"a")}},
			{Domain: "web", Descriptors: []*rlcommon.RateLimitDescriptor{envoytest.Descriptor("ip", long+"a")}}},
			want: []descStatus{{rpu: 2, remaining: 0, reset: minuteLeft}}},
		{name: "two long values", reqs: []*rls.RateLimitRequest{
			{Domain: "web", Descriptors: []*rlcommon.RateLimitDescriptor{envoytest.Descriptor("ip", long+"a")}},
			{Domain: "web", Descriptors: []*rlcommon.RateLimitDescriptor{envoytest.Descriptor("ip", long+"b")}}},
			want: []descStatus{{rpu: 2, remaining: 1, reset: minuteLeft}}},
		{name: "a long key with its own limit", reqs: []*rls.RateLimitRequest{{Domain: "web",
			Descriptors: []*rlcommon.RateLimitDescriptor{{Entries: envoytest.Descriptor(long, "a").Entries, Limit: &rlcommon.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 10, Unit: typev3.RateLimitUnit_HOUR}}}}},
			want: []descStatus{{rpu: 10, remaining: 9, reset: hourLeft}}},
		{name: "atomic: over on one, none charged", atomic: true, reqs: []*rls.RateLimitRequest{
			{Domain: "web", Descriptors: []*rlcommon.RateLimitDescriptor{envoytest.Descriptor("ip", "a")}},
			{Domain: "web", Descriptors: []*rlcommon.RateLimitDescriptor{envoytest.Descriptor("ip", "a")}},
			{Domain: "web", Descriptors: []*rlcommon.RateLimitDescriptor{envoytest.Descriptor("ip", "b"), envoytest.Descriptor("ip", "a")}},
			{Domain: "web", Descriptors: []*rlcommon.RateLimitDescriptor{envoytest.Descriptor("ip", "b")}}},
			want: []descStatus{{rpu: 2, remaining: 1, reset: minuteLeft}}},
		{name: "default: over on one, the others charged", reqs: []*rls.RateLimitRequest{
			{Domain: "web", Descriptors: []*rlcommon.RateLimitDescriptor{envoytest.Descriptor("ip", "a")}},
			{Domain: "web", Descriptors: []*rlcommon.RateLimitDescriptor{envoytest.Descriptor("ip", "a")}},
			{Domain: "web", Descriptors: []*rlcommon.RateLimitDescriptor{envoytest.Descriptor("ip", "b"), envoytest.Descriptor("ip", "a")}},
			{Domain: "web", Descriptors: []*rlcommon.RateLimitDescriptor{envoytest.Descriptor("ip", "b")}}},
			want: []descStatus{{rpu: 2, remaining: 0, reset: minuteLeft}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			svc := newEnvoy(t, envoy.Options{StopIncrementWhenOverLimit: tc.atomic})
			var resp *rls.RateLimitResponse
			for _, req := range tc.reqs {
				var err error
				if resp, err = svc.ShouldRateLimit(context.Background(), req); err != nil {
					t.Fatal(err)
				}
			}
			if got := resp.OverallCode == rls.RateLimitResponse_OVER_LIMIT; got != tc.over {
				t.Errorf("overall over limit: %v, want %v (%v)", got, tc.over, resp)
			}
			if len(resp.Statuses) != len(tc.want) {
				t.Fatalf("%d statuses, want %d", len(resp.Statuses), len(tc.want))
			}
			for i, w := range tc.want {
				if got := short(resp.Statuses[i]); got != w {
					t.Errorf("status %d: %+v, want %+v", i, got, w)
				}
			}
		})
	}
}

func TestShouldRateLimitHeaders(t *testing.T) {
	svc := newEnvoy(t, envoy.Options{RateLimitHeaders: true})
	resp, err := svc.ShouldRateLimit(context.Background(), &rls.RateLimitRequest{Domain: "web",
		Descriptors: []*rlcommon.RateLimitDescriptor{envoytest.Descriptor("free", "x"), envoytest.Descriptor("ip", "a"), envoytest.Descriptor("nope", "x")}})
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, h := range resp.ResponseHeadersToAdd {
		got = append(got, h.Key+": "+h.Value)
	}
	want := "RateLimit-Limit: 2, RateLimit-Remaining: 1, RateLimit-Reset: 50"
	if strings.Join(got, ", ") != want {
		t.Errorf("headers %q, want %q", strings.Join(got, ", "), want)
	}
}

func TestShouldRateLimitBadInput(t *testing.T) {
	svc := newEnvoy(t, envoy.Options{})
	for _, tc := range []struct {
		req  *rls.RateLimitRequest
		want string
	}{
		{&rls.RateLimitRequest{Descriptors: []*rlcommon.RateLimitDescriptor{envoytest.Descriptor("ip", "a")}}, "rate limit domain must not be empty"},
		{&rls.RateLimitRequest{Domain: "web"}, "rate limit descriptor list must not be empty"},
		{&rls.RateLimitRequest{Domain: "web", Descriptors: make([]*rlcommon.RateLimitDescriptor, envoy.MaxDescriptors+1)}, "holds 1001 descriptors, more than the maximum 1000"},
		{&rls.RateLimitRequest{Domain: "web", Descriptors: []*rlcommon.RateLimitDescriptor{{Entries: envoytest.Descriptor("ip", "a").Entries, Limit: &rlcommon.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 1}}}}, "no valid unit"},
	} {
		_, err := svc.ShouldRateLimit(context.Background(), tc.req)
		if !errors.Is(err, service.ErrBadRequest) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: error %v, want ErrBadRequest with %q", tc.req, err, tc.want)
		}
	}
}

// TestEnvoyOneScriptCall: on Redis, a request's descriptors are decided
// in one script call, and under the atomic option a request over one
// limit leaves the others' counters as they were.
func TestEnvoyOneScriptCall(t *testing.T) {
	const domain = `domain: api
descriptors:
  - key: user
    rate_limit: {unit: hour, requests_per_unit: 10}
  - key: path
    rate_limit: {unit: hour, requests_per_unit: 10}
  - key: tenant
    rate_limit: {unit: hour, requests_per_unit: 1}
`
	srv := redistest.Start(t)
	for _, atomic := range []bool{false, true} {
		st := redisstore.New(srv.Client(t), &redisstore.Options{Prefix: fmt.Sprintf("one%v:", atomic)})
		t.Cleanup(func() { st.Close() })
		svc := newEnvoyOn(t, st, "api.yaml", domain, &envoy.Options{StopIncrementWhenOverLimit: atomic})
		ask := func(descs ...*rlcommon.RateLimitDescriptor) *rls.RateLimitResponse {
			t.Helper()
			before := st.Stats().ScriptCalls
			resp, err := svc.ShouldRateLimit(context.Background(), &rls.RateLimitRequest{Domain: "api", Descriptors: descs})
			if err != nil {
				t.Fatal(err)
			}
			if calls := st.Stats().ScriptCalls - before; calls != 1 {
				t.Errorf("atomic=%v: %d descriptors took %d script calls, want 1", atomic, len(descs), calls)
			}
			return resp
		}
		ask(envoytest.Descriptor("tenant", "t"))
		resp := ask(envoytest.Descriptor("user", "u"), envoytest.Descriptor("path", "/p"), envoytest.Descriptor("tenant", "t"))
		if resp.OverallCode != rls.RateLimitResponse_OVER_LIMIT {
			t.Fatalf("atomic=%v: %v, want OVER_LIMIT", atomic, resp)
		}
		want := uint32(8) // the user's second hit counted
		if atomic {
			want = 9 // not counted: the request was over the tenant's limit
		}
		resp = ask(envoytest.Descriptor("user", "u"))
		if got := resp.Statuses[0].LimitRemaining; got != want {
			t.Errorf("atomic=%v: the user's remaining after an over-limit request: %d, want %d", atomic, got, want)
		}
	}
}
