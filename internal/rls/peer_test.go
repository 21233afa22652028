package rls_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/floodgate/floodgate/internal/config"
	"github.com/floodgate/floodgate/internal/peertest"
	"github.com/floodgate/floodgate/internal/redistest"
	"github.com/floodgate/floodgate/internal/service"
	"github.com/floodgate/floodgate/redisstore"
)

// diffConfig exercises what envoyproxy/ratelimit's format has: values,
// nesting, a trailing wildcard, share_threshold, unlimited, shadow_mode,
// a limit of 0, and replaces. Units are hours and days, so that a run
// does not cross a window's end.
const diffConfig = `domain: diff
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
`

// TestSameAnswersAsEnvoyRatelimit sends the same random requests to
// envoyproxy/ratelimit and to floodgate, both over gRPC and on one
// redis-server, and compares the answers field by field: in the default
// mode, where hits over the limit count, and with
// STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT.
func TestSameAnswersAsEnvoyRatelimit(t *testing.T) {
	peertest.Build(t)
	waitOutHourEnd(t)
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
			peer := peertest.Start(t, srv.Addr, map[string]string{"diff.yaml": diffConfig}, env...)
			ours := startFloodgate(t, srv.Addr, tc.atomic)
			theirs := peertest.Client(t, peer.GRPC)

			rng := rand.New(rand.NewPCG(1, uint64(len(tc.name))))
			over, differing := 0, 0
			for step := range 400 {
				req := randomRequest(rng, tc.atomic)
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
			t.Logf("400 requests, %d over the limit, %d answers differing", over, differing)
			if over == 0 || over == 400 {
				t.Errorf("%d of 400 requests over the limit: the sequence tests too little", over)
			}
		})
	}
}

// waitOutHourEnd waits, at most a few seconds, for an hour to end when
// one is about to: windows of an hour must not end between the two
// services' answers.
func waitOutHourEnd(t *testing.T) {
	left := time.Hour - time.Duration(time.Now().UnixNano())%time.Hour
	if left < 5*time.Second {
		time.Sleep(left + 100*time.Millisecond)
	}
	if left := time.Hour - time.Duration(time.Now().UnixNano())%time.Hour; left < 2*time.Minute {
		// A run takes seconds; give it room.
		t.Logf("%s to the end of the hour", left)
	}
}

func startFloodgate(t *testing.T, redisAddr string, atomic bool) rlsv3.RateLimitServiceClient {
	t.Helper()
	cfg, err := config.Parse("diff.yaml", []byte(diffConfig))
	if err != nil {
		t.Fatal(err)
	}
	st, err := redisstore.NewFromURL("redis://"+redisAddr, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	svc, err := service.New(st, cfg, &service.Options{StopIncrementWhenOverLimit: atomic})
	if err != nil {
		t.Fatal(err)
	}
	addr, _ := startGRPC(t, svc)
	return peertest.Client(t, addr)
}

// shadowDescriptor is the index of the shadow_mode maker in descriptors.
const shadowDescriptor = 7

// descriptor makers: what Envoy's actions produce, with values from small
// sets so that counters fill up.
var descriptors = []func(r *rand.Rand) *rlcommon.RateLimitDescriptor{
	func(r *rand.Rand) *rlcommon.RateLimitDescriptor {
		return desc("remote_address", fmt.Sprintf("10.0.0.%d", r.IntN(3)))
	},
	func(r *rand.Rand) *rlcommon.RateLimitDescriptor {
		return desc("database", []string{"users", "orders"}[r.IntN(2)])
	},
	func(r *rand.Rand) *rlcommon.RateLimitDescriptor {
		return desc("message_type", []string{"marketing", "alerts"}[r.IntN(2)], "to_number", fmt.Sprint(r.IntN(2)))
	},
	func(r *rand.Rand) *rlcommon.RateLimitDescriptor {
		return desc("message_type", "marketing")
	},
	func(r *rand.Rand) *rlcommon.RateLimitDescriptor {
		return desc("path", []string{"/api/a", "/api/b", "/other"}[r.IntN(3)])
	},
	func(r *rand.Rand) *rlcommon.RateLimitDescriptor {
		return desc("files", []string{"/f/1", "/f/2", "/f/3"}[r.IntN(3)])
	},
	func(r *rand.Rand) *rlcommon.RateLimitDescriptor { return desc("free", "x") },
	func(r *rand.Rand) *rlcommon.RateLimitDescriptor { return desc("shadow", "x") },
	func(r *rand.Rand) *rlcommon.RateLimitDescriptor { return desc("blocked", "x") },
	func(r *rand.Rand) *rlcommon.RateLimitDescriptor {
		return desc("tier", []string{"low", "high"}[r.IntN(2)])
	},
	func(r *rand.Rand) *rlcommon.RateLimitDescriptor { return desc("unknown", "x") },
	func(r *rand.Rand) *rlcommon.RateLimitDescriptor {
		// Longer than a store key: a path or header as Envoy sends it.
		return desc("remote_address", strings.Repeat("a", 2000)+fmt.Sprint(r.IntN(2)))
	},
	func(r *rand.Rand) *rlcommon.RateLimitDescriptor {
		d := desc("remote_address", fmt.Sprintf("10.9.0.%d", r.IntN(2)))
		d.Limit = &rlcommon.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 3, Unit: typev3.RateLimitUnit_HOUR}
		return d
	},
}

func desc(kv ...string) *rlcommon.RateLimitDescriptor {
	d := &rlcommon.RateLimitDescriptor{}
	for i := 0; i+1 < len(kv); i += 2 {
		d.Entries = append(d.Entries, &rlcommon.RateLimitDescriptor_Entry{Key: kv[i], Value: kv[i+1]})
	}
	return d
}

// randomRequest makes a request of one to three descriptors.
//
// With the atomic option, the requests stay where envoyproxy/ratelimit's
// GET-then-INCR approximation is exact (docs/envoy.md lists the rest): every
// hit counts one (with more, it still adds the hits of the descriptor
// that goes over), no counter comes twice in a request (it checks each
// against the count before the request), and no shadow_mode limit (one
// over its limit stops the others' increments there, though the request
// is allowed; in floodgate a shadow limit never changes what is charged).
func randomRequest(r *rand.Rand, atomic bool) *rlsv3.RateLimitRequest {
	req := &rlsv3.RateLimitRequest{Domain: "diff"}
	if r.IntN(20) == 0 {
		req.Domain = "nodomain"
	}
	used := map[int]bool{}
	for range 1 + r.IntN(3) {
		i := r.IntN(len(descriptors))
		if atomic && (used[i] || i == shadowDescriptor) {
			continue
		}
		used[i] = true
		d := descriptors[i](r)
		if !atomic && r.IntN(5) == 0 {
			d.HitsAddend = wrapperspb.UInt64(uint64(r.IntN(4))) // 0 peeks
		}
		req.Descriptors = append(req.Descriptors, d)
	}
	if !atomic {
		req.HitsAddend = uint32(r.IntN(3)) // 0 means 1
	}
	if len(req.Descriptors) == 0 {
		req.Descriptors = append(req.Descriptors, descriptors[0](r))
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
