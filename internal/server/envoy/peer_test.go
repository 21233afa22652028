package envoy_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"regexp"
	"strings"
	"testing"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/floodgate/floodgate/internal/server/config"
	"github.com/floodgate/floodgate/internal/server/envoy"
	"github.com/floodgate/floodgate/internal/server/service"
	"github.com/floodgate/floodgate/internal/testkit/envoytest"
	"github.com/floodgate/floodgate/internal/testkit/peertest"
	"github.com/floodgate/floodgate/internal/testkit/redistest"
	"github.com/floodgate/floodgate/redisstore"
)

// feature is a part of envoyproxy/ratelimit's format or answers that
// not every version the differential test may run against has: the test
// sends what needs one only to a version known to have it (peerFeatures).
type feature uint

const (
	// midWildcards: a * in the middle of a value, or several. Before, only
	// a trailing * was a wildcard (others literal), and share_threshold
	// refused the rest.
	midWildcards feature = 1 << iota
	// descMetadata: a descriptor's metadata. Before, the config loader refused
	// the key, and so the whole domain.
	descMetadata
	// quotaMode: quota_mode's answer of March 2026, which floodgate gives
	// (OVER_LIMIT past the limit); before, a quota over its limit was OK.
	quotaMode
)

// peerFeatures is what each known version of envoyproxy/ratelimit has
// beyond January's main (peertest.RatelimitVersion). A version not here
// gets January's features.
var peerFeatures = map[string]feature{
	// main of 2026-01-22: the newest the module proxy serves; the default.
	"v1.4.1-0.20260122083618-3fb702589d36": 0,
	// main of 2026-07-06: built from a checkout (FLOODGATE_RATELIMIT_SRC).
	"v1.4.1-0.20260706065234-f2fb15770f7f": midWildcards | descMetadata | quotaMode,
}

// peerFeaturesOf returns the features of the peer version v.
func peerFeaturesOf(t *testing.T, v string) feature {
	f, ok := peerFeatures[v]
	if !ok {
		t.Logf("envoyproxy/ratelimit %s is not in peerFeatures: testing only what %s has", v, peertest.RatelimitVersion)
	}
	return f
}

// diffConfigParts, joined by diffConfig, exercise what envoyproxy/ratelimit's
// format has: values, nesting, wildcards (trailing, in the middle,
// several), share_threshold on each, unlimited, shadow_mode, quota_mode,
// metadata, a limit of 0, replaces, and every unit. The counting limits
// are of a minute or more, and a run does not cross a minute's end
// (waitOutWindowEnd); the limit of a second is 0, which every hit is over
// whatever its window.
var diffConfigParts = []struct {
	needs feature
	yaml  string
}{{0, `domain: diff
descriptors:
  - key: remote_address
    rate_limit: {unit: hour, requests_per_unit: 5}
  - key: database
    value: users
    rate_limit: {unit: day, requests_per_unit: 4}
  - key: message_type
    value: marketing
    descriptors:
      - key: to_number
        rate_limit: {unit: day, requests_per_unit: 3}
  - key: path
    value: /api/*
    rate_limit: {unit: hour, requests_per_unit: 6}
  - key: files
    value: /f/*
    share_threshold: true
    rate_limit: {unit: hour, requests_per_unit: 4}
  - key: free
    rate_limit: {unlimited: true}
  - key: shadow
    shadow_mode: true
    rate_limit: {unit: hour, requests_per_unit: 2}
  - key: blocked
    rate_limit: {unit: hour, requests_per_unit: 0}
  - key: tier
    value: low
    rate_limit: {unit: hour, requests_per_unit: 2, name: low}
  - key: tier
    value: high
    rate_limit: {unit: hour, requests_per_unit: 9, replaces: [{name: low}]}
  - key: persecond
    rate_limit: {unit: second, requests_per_unit: 0}
`}, {midWildcards, `  - key: route
    value: /api/*/action
    rate_limit: {unit: minute, requests_per_unit: 4}
  - key: route
    value: /api/*/res/*/action
    rate_limit: {unit: week, requests_per_unit: 5}
  - key: route
    value: /api/v1/res/1/action
    rate_limit: {unit: month, requests_per_unit: 3}
  - key: tenant
    value: t*prod
    share_threshold: true
    descriptors:
      - key: svc
        value: s*e*c
        share_threshold: true
        rate_limit: {unit: year, requests_per_unit: 4}
  - key: mid
    value: a*z
    share_threshold: true
    value_to_metric: true
    rate_limit: {unit: day, requests_per_unit: 3}
`}, {descMetadata, `  - key: meta
    value: m*
    share_threshold: true
    metadata: {team: edge, owners: [a, b], limits: {soft: 1}}
    descriptors:
      - key: op
        metadata: {op: true}
        rate_limit: {unit: minute, requests_per_unit: 4}
`}, {quotaMode, `  - key: quota
    value: q*
    quota_mode: true
    rate_limit: {unit: hour, requests_per_unit: 2}
`}}

// diffConfig returns the domain of the parts that the features have.
func diffConfig(have feature) string {
	var b strings.Builder
	for _, p := range diffConfigParts {
		if p.needs&have == p.needs {
			b.WriteString(p.yaml)
		}
	}
	return b.String()
}

// TestSameAnswersAsEnvoyRatelimit sends the same random requests to
// envoyproxy/ratelimit and to floodgate, both over gRPC and on one
// redis-server, and compares the answers field by field: in the default
// mode, where hits over the limit count, and with
// STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT.
func TestSameAnswersAsEnvoyRatelimit(t *testing.T) {
	peertest.Build(t)
	v, err := peertest.Version()
	if err != nil {
		t.Fatal(err) // Build has skipped or failed already
	}
	have := peerFeaturesOf(t, v)
	domain, ms := diffConfig(have), makersFor(have)
	t.Logf("envoyproxy/ratelimit %s: %d descriptor makers", v, len(ms))
	for _, tc := range []struct {
		name   string
		atomic bool
	}{
		{"default", false},
		{"stop-increment-when-overlimit", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := redistest.Start(t)
			var env []string
			if tc.atomic {
				env = append(env, "STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT=true")
			}
			peer := peertest.Start(t, srv.Addr, map[string]string{"diff.yaml": domain}, env...)
			ours := startFloodgate(t, srv.Addr, domain, tc.atomic)
			theirs := peertest.Client(t, peer.GRPC)
			waitOutWindowEnd(t, time.Minute, 5*time.Second)
			start := time.Now()

			rng := rand.New(rand.NewPCG(1, uint64(len(tc.name))))
			over, differing := 0, 0
			for step := range 400 {
				req := randomRequest(rng, ms, tc.atomic)
				want, err := theirs.ShouldRateLimit(context.Background(), req)
				if err != nil {
					t.Fatalf("step %d: envoyproxy/ratelimit: %v", step, err)
				}
				got, err := ours.ShouldRateLimit(context.Background(), req)
				if err != nil {
					t.Fatalf("step %d: floodgate: %v", step, err)
				}
				if want.OverallCode == rlsv3.RateLimitResponse_OVER_LIMIT {
					over++
				}
				if msg := compare(want, got); msg != "" {
					differing++
					if differing <= 5 {
						t.Errorf("step %d: %v\n%s\nenvoyproxy/ratelimit: %v\nfloodgate:            %v", step, req, msg, want, got)
					}
				}
			}
			t.Logf("400 requests in %s, %d over the limit, %d answers differing", time.Since(start).Round(time.Millisecond), over, differing)
			if over == 0 || over == 400 {
				t.Errorf("%d of 400 requests over the limit: the sequence tests too little", over)
			}
		})
	}
}

// TestDiffConfigFitsPeer checks, without a peer, that the domain each
// known version gets parses, and holds nothing its version lacks: a
// January peer would refuse metadata and a middle * with share_threshold,
// and answer otherwise than floodgate on other middle *s and quota_mode.
func TestDiffConfigFitsPeer(t *testing.T) {
	midStar := regexp.MustCompile(`value: \S*\*\S`)
	for v, have := range peerFeatures {
		domain := diffConfig(have)
		if _, err := config.Parse("diff.yaml", []byte(domain)); err != nil {
			t.Errorf("%s: %v", v, err)
		}
		for _, c := range []struct {
			f    feature
			bad  func(string) bool
			what string
		}{
			{midWildcards, midStar.MatchString, "a * before a value's end"},
			{descMetadata, func(s string) bool { return strings.Contains(s, "metadata:") }, "metadata"},
			{quotaMode, func(s string) bool { return strings.Contains(s, "quota_mode:") }, "quota_mode"},
		} {
			if have&c.f == 0 && c.bad(domain) {
				t.Errorf("%s lacks %s, which its domain has:\n%s", v, c.what, domain)
			}
		}
	}
}

// waitOutWindowEnd waits for a window of length w (a minute: the
// shortest that counts) to end when less than room is left of it: no
// window may end between the two services' answers, and a run takes a
// few seconds. Every longer unit ends at the end of a minute too.
func waitOutWindowEnd(t *testing.T, w, room time.Duration) {
	left := w - time.Duration(time.Now().UnixNano())%w
	if left < room {
		t.Logf("waiting %s for a %s window to end", left, w)
		time.Sleep(left + 100*time.Millisecond)
	}
}

func startFloodgate(t *testing.T, redisAddr, domain string, atomic bool) rlsv3.RateLimitServiceClient {
	t.Helper()
	cfg, err := config.Parse("diff.yaml", []byte(domain))
	if err != nil {
		t.Fatal(err)
	}
	st, err := redisstore.NewFromURL("redis://"+redisAddr, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	svc, err := envoy.New(st, cfg, &service.Options{}, &envoy.Options{StopIncrementWhenOverLimit: atomic})
	if err != nil {
		t.Fatal(err)
	}
	addr, _ := startGRPC(t, svc)
	return peertest.Client(t, addr)
}

// maker makes a descriptor as Envoy's actions do, with values from small
// sets so that counters fill up.
type maker struct {
	needs feature
	// chargeless: a shadow_mode or quota_mode limit matches, which the
	// atomic mode leaves out (see randomRequest).
	chargeless bool
	// blocked: its limit is requests_per_unit 0, on which a request of 0
	// hits is a deliberate difference (docs/envoy.md): it gets 1 or more.
	blocked bool
	make    func(r *rand.Rand) *rlcommon.RateLimitDescriptor
}

// makers are the descriptor makers; a request takes those whose features
// the peer has (makersFor).
var makers = []maker{
	{make: func(r *rand.Rand) *rlcommon.RateLimitDescriptor {
		return envoytest.Descriptor("remote_address", fmt.Sprintf("10.0.0.%d", r.IntN(3)))
	}},
	{make: func(r *rand.Rand) *rlcommon.RateLimitDescriptor {
		return envoytest.Descriptor("database", []string{"users", "orders"}[r.IntN(2)])
	}},
	{make: func(r *rand.Rand) *rlcommon.RateLimitDescriptor {
		return envoytest.Descriptor("message_type", []string{"marketing", "alerts"}[r.IntN(2)], "to_number", fmt.Sprint(r.IntN(2)))
	}},
	{make: func(r *rand.Rand) *rlcommon.RateLimitDescriptor {
		return envoytest.Descriptor("message_type", "marketing")
	}},
	{make: func(r *rand.Rand) *rlcommon.RateLimitDescriptor {
		return envoytest.Descriptor("path", []string{"/api/a", "/api/b", "/other"}[r.IntN(3)])
	}},
	{make: func(r *rand.Rand) *rlcommon.RateLimitDescriptor {
		return envoytest.Descriptor("files", []string{"/f/1", "/f/2", "/f/3"}[r.IntN(3)])
	}},
	{make: func(r *rand.Rand) *rlcommon.RateLimitDescriptor { return envoytest.Descriptor("free", "x") }},
	{chargeless: true, make: func(r *rand.Rand) *rlcommon.RateLimitDescriptor { return envoytest.Descriptor("shadow", "x") }},
	{make: func(r *rand.Rand) *rlcommon.RateLimitDescriptor { return envoytest.Descriptor("blocked", "x") }},
	{make: func(r *rand.Rand) *rlcommon.RateLimitDescriptor {
		return envoytest.Descriptor("tier", []string{"low", "high"}[r.IntN(2)])
	}},
	{make: func(r *rand.Rand) *rlcommon.RateLimitDescriptor { return envoytest.Descriptor("unknown", "x") }},
	{make: func(r *rand.Rand) *rlcommon.RateLimitDescriptor {
		// Longer than a store key: a path or header as Envoy sends it.
		return envoytest.Descriptor("remote_address", strings.Repeat("a", 2000)+fmt.Sprint(r.IntN(2)))
	}},
	{make: func(r *rand.Rand) *rlcommon.RateLimitDescriptor {
		// 7 is the RLS answer's WEEK, which the descriptor's enum lacks.
		// Each unit has its own values: envoyproxy/ratelimit's counters of
		// two units on one descriptor are one when their windows start
		// together (an hour's and a day's at midnight), floodgate's never.
		units := []typev3.RateLimitUnit{typev3.RateLimitUnit_MINUTE, typev3.RateLimitUnit_HOUR, typev3.RateLimitUnit_DAY, 7, typev3.RateLimitUnit_MONTH, typev3.RateLimitUnit_YEAR}
		u := r.IntN(len(units))
		d := envoytest.Descriptor("remote_address", fmt.Sprintf("10.9.%d.%d", u, r.IntN(2)))
		d.Limit = &rlcommon.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 3, Unit: units[u]}
		return d
	}},
	{blocked: true, make: func(r *rand.Rand) *rlcommon.RateLimitDescriptor { return envoytest.Descriptor("persecond", "x") }},
	{needs: midWildcards, make: func(r *rand.Rand) *rlcommon.RateLimitDescriptor {
		return envoytest.Descriptor("route", []string{"/api/1/action", "/api/x/y/action", "/api/1/other", "/api//action", "/api/action"}[r.IntN(5)])
	}},
	{needs: midWildcards, make: func(r *rand.Rand) *rlcommon.RateLimitDescriptor {
		return envoytest.Descriptor("route", []string{"/api/v1/res/1/action", "/api/v1/res/2/action", "/api/v2/res/x/y/action", "/api/res/1/action"}[r.IntN(4)])
	}},
	{needs: midWildcards, make: func(r *rand.Rand) *rlcommon.RateLimitDescriptor {
		return envoytest.Descriptor("tenant", []string{"t1prod", "t2prod", "tprod", "t1dev"}[r.IntN(4)], "svc", []string{"sec", "s1e2c", "sxc", "s-e-c-"}[r.IntN(4)])
	}},
	{needs: midWildcards, make: func(r *rand.Rand) *rlcommon.RateLimitDescriptor {
		return envoytest.Descriptor("mid", []string{"az", "abz", "a/b/z", "za", "ab"}[r.IntN(5)])
	}},
	{needs: descMetadata, make: func(r *rand.Rand) *rlcommon.RateLimitDescriptor {
		return envoytest.Descriptor("meta", []string{"m1", "m2", "x"}[r.IntN(3)], "op", []string{"get", "put"}[r.IntN(2)])
	}},
	{needs: quotaMode, chargeless: true, make: func(r *rand.Rand) *rlcommon.RateLimitDescriptor {
		return envoytest.Descriptor("quota", []string{"q1", "q2", "x"}[r.IntN(3)])
	}},
}

// makersFor returns the makers whose features are in have.
func makersFor(have feature) []maker {
	var ms []maker
	for _, m := range makers {
		if m.needs&have == m.needs {
			ms = append(ms, m)
		}
	}
	return ms
}

// randomRequest makes a request of one to three descriptors.
//
// With the atomic option, the requests stay where envoyproxy/ratelimit's
// GET-then-INCR approximation is exact (docs/envoy.md lists the rest): every
// hit counts one (with more, it still adds the hits of the descriptor
// that goes over), no counter comes twice in a request (it checks each
// against the count before the request), and no shadow_mode or quota_mode
// limit (one over its limit stops the others' increments there, though
// the request may be allowed; in floodgate such a limit never changes
// what is charged).
func randomRequest(r *rand.Rand, ms []maker, atomic bool) *rlsv3.RateLimitRequest {
	req := &rlsv3.RateLimitRequest{Domain: "diff"}
	if r.IntN(20) == 0 {
		req.Domain = "nodomain"
	}
	used := map[int]bool{}
	for range 1 + r.IntN(3) {
		i := r.IntN(len(ms))
		if atomic && (used[i] || ms[i].chargeless) {
			continue
		}
		used[i] = true
		d := ms[i].make(r)
		if !atomic && r.IntN(5) == 0 {
			hits := uint64(r.IntN(4)) // 0 peeks
			if hits == 0 && ms[i].blocked {
				hits = 1
			}
			d.HitsAddend = wrapperspb.UInt64(hits)
		}
		req.Descriptors = append(req.Descriptors, d)
	}
	if !atomic {
		req.HitsAddend = uint32(r.IntN(3)) // 0 means 1
	}
	if len(req.Descriptors) == 0 {
		req.Descriptors = append(req.Descriptors, ms[0].make(r))
	}
	return req
}

// compare returns "" when the answers are the same, field by field,
// DurationUntilReset within a second (each service reads its own clock).
func compare(want, got *rlsv3.RateLimitResponse) string {
	w, g := proto.Clone(want).(*rlsv3.RateLimitResponse), proto.Clone(got).(*rlsv3.RateLimitResponse)
	if len(w.Statuses) != len(g.Statuses) {
		return fmt.Sprintf("%d statuses, want %d", len(g.Statuses), len(w.Statuses))
	}
	for i := range w.Statuses {
		wd, gd := w.Statuses[i].DurationUntilReset, g.Statuses[i].DurationUntilReset
		if (wd == nil) != (gd == nil) {
			return fmt.Sprintf("status %d: DurationUntilReset %v, want %v", i, gd, wd)
		}
		if wd != nil {
			if diff := wd.AsDuration() - gd.AsDuration(); diff < -time.Second || diff > time.Second {
				return fmt.Sprintf("status %d: DurationUntilReset %v, want %v", i, gd.AsDuration(), wd.AsDuration())
			}
		}
		w.Statuses[i].DurationUntilReset, g.Statuses[i].DurationUntilReset = nil, nil
	}
	if !proto.Equal(w, g) {
		return "the answers differ"
	}
	return ""
}
