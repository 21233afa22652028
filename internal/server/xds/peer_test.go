package xds_test

import (
	"context"
	"fmt"
	"log/slog"
	"math"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	rlsconf "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"
	"google.golang.org/protobuf/proto"

	"github.com/floodgate/floodgate/internal/server/config"
	"github.com/floodgate/floodgate/internal/server/envoy"
	"github.com/floodgate/floodgate/internal/server/service"
	"github.com/floodgate/floodgate/internal/server/xds"
	"github.com/floodgate/floodgate/internal/testkit/envoytest"
	"github.com/floodgate/floodgate/internal/testkit/peertest"
	"github.com/floodgate/floodgate/internal/testkit/redistest"
	"github.com/floodgate/floodgate/internal/testkit/xdstest"
	"github.com/floodgate/floodgate/redisstore"
)

// peerVersion is a snapshot of the differential test: domain "diff",
// with a probe descriptor, version=<name> (unlimited), by which the test
// sees that a service has applied it.
func peerVersion(name string, ds ...*rlsconf.RateLimitDescriptor) *rlsconf.RateLimitConfig {
	probe := &rlsconf.RateLimitDescriptor{Key: "version", Value: name, RateLimit: &rlsconf.RateLimitPolicy{Unlimited: true}}
	return &rlsconf.RateLimitConfig{Name: "diff", Domain: "diff", Descriptors: append([]*rlsconf.RateLimitDescriptor{probe}, ds...)}
}

func limited(key, value string, u rlsconf.RateLimitUnit, rpu uint32, sub ...*rlsconf.RateLimitDescriptor) *rlsconf.RateLimitDescriptor {
	d := &rlsconf.RateLimitDescriptor{Key: key, Value: value, Descriptors: sub}
	if rpu > 0 || u != 0 {
		d.RateLimit = policy(u, rpu)
	}
	return d
}

// peerSteps are the snapshots the test sends, in order, each to both
// services: limits raised and lowered (the counters go on), descriptors
// added and removed, a bad one (both keep the one before), and one
// served after the management server was gone.
var peerSteps = []struct {
	name string
	rc   *rlsconf.RateLimitConfig
	bad  bool // refused: the services keep the one before
	gone bool // the management server stops before and restarts with it
}{
	{name: "v1", rc: peerVersion("v1",
		limited("remote_address", "", rlsconf.RateLimitUnit_HOUR, 6),
		limited("path", "/login", rlsconf.RateLimitUnit_DAY, 3),
		limited("database", "users", rlsconf.RateLimitUnit_DAY, 4),
	)},
	{name: "v2", rc: peerVersion("v2",
		limited("remote_address", "", rlsconf.RateLimitUnit_HOUR, 10), // raised
		limited("path", "/login", rlsconf.RateLimitUnit_DAY, 2),       // lowered below the count
		limited("message_type", "marketing", 0, 0, limited("to_number", "", rlsconf.RateLimitUnit_DAY, 3)),
	)},
	{name: "v3", bad: true, rc: peerVersion("v3",
		limited("remote_address", "", rlsconf.RateLimitUnit_HOUR, 1),
		limited("path", "", 9, 1), // no such unit
	)},
	{name: "v4", rc: peerVersion("v4",
		limited("remote_address", "", rlsconf.RateLimitUnit_HOUR, 12),
		limited("path", "/login", rlsconf.RateLimitUnit_DAY, 5),
		limited("database", "users", rlsconf.RateLimitUnit_DAY, 4), // back, with its count
		&rlsconf.RateLimitDescriptor{Key: "free", RateLimit: &rlsconf.RateLimitPolicy{Unlimited: true}},
	)},
	{name: "v5", gone: true, rc: peerVersion("v5",
		limited("remote_address", "", rlsconf.RateLimitUnit_HOUR, 8), // lowered below the count
		limited("path", "/login", rlsconf.RateLimitUnit_DAY, 5),
		limited("message_type", "marketing", 0, 0, limited("to_number", "", rlsconf.RateLimitUnit_DAY, 3)),
	)},
}

// peerRequest makes a request of one or two descriptors from small sets
// of values, so that counters fill up.
func peerRequest(r *rand.Rand) *rlsv3.RateLimitRequest {
	makers := []func() []string{
		func() []string { return []string{"remote_address", fmt.Sprintf("10.0.0.%d", r.IntN(2))} },
		func() []string { return []string{"path", []string{"/login", "/other"}[r.IntN(2)]} },
		func() []string { return []string{"database", []string{"users", "orders"}[r.IntN(2)]} },
		func() []string { return []string{"message_type", "marketing", "to_number", fmt.Sprint(r.IntN(2))} },
		func() []string { return []string{"free", "x"} },
	}
	req := envoytest.Request("diff")
	for range 1 + r.IntN(2) {
		req.Descriptors = append(req.Descriptors, envoytest.Descriptor(makers[r.IntN(len(makers))]()...))
	}
	return req
}

// TestSameUpdatesAsEnvoyRatelimit serves the same snapshots from one
// go-control-plane management server to envoyproxy/ratelimit, run in its
// xDS mode (CONFIG_TYPE=GRPC_XDS_SOTW, with its own environment), and to
// floodgate's client, both counting on one redis-server, and compares
// their answers to the same requests after each update: counters kept
// across an update, a bad snapshot refused by both, the server gone and
// back with a new version.
func TestSameUpdatesAsEnvoyRatelimit(t *testing.T) {
	peertest.Build(t)
	redis := redistest.Start(t)
	m := xdstest.Start(t, xdstest.Options{Node: "floodgate"})
	m.Set("upstream", "v1", peerSteps[0].rc)
	m.Set("floodgate", "v1", peerSteps[0].rc)

	peer := peertest.Start(t, redis.Addr, nil,
		"CONFIG_TYPE=GRPC_XDS_SOTW", "CONFIG_GRPC_XDS_SERVER_URL="+m.Addr, "CONFIG_GRPC_XDS_NODE_ID=upstream",
		"CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL=100ms",
		"XDS_CLIENT_BACKOFF_INITIAL_INTERVAL=100ms", "XDS_CLIENT_BACKOFF_MAX_INTERVAL=500ms")
	theirs := peertest.Client(t, peer.GRPC)

	st, err := redisstore.NewFromURL("redis://"+redis.Addr, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	empty, err := config.FromDomains(xds.Source, nil, false)
	if err != nil {
		t.Fatal(err)
	}
	rl, err := envoy.New(st, empty, &service.Options{Logger: slog.New(slog.DiscardHandler)}, &envoy.Options{})
	if err != nil {
		t.Fatal(err)
	}
	c, err := xds.Start(xds.Options{Server: m.Addr, NodeID: "floodgate", BackoffMin: 50 * time.Millisecond, BackoffMax: 200 * time.Millisecond,
		Logger: slog.New(slog.DiscardHandler),
		Apply:  func(cfg *config.Config, err error) error { return rl.Rules().Apply(xds.Source, cfg, err) }})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Stop()

	// The counting windows are of an hour or a day: a run must not cross
	// the end of an hour, which is the end of a minute too.
	if left := time.Hour - time.Duration(time.Now().UnixNano())%time.Hour; left < 30*time.Second {
		t.Logf("waiting %s for the hour to end", left)
		time.Sleep(left + 100*time.Millisecond)
	}
	ctx := context.Background()
	rng := rand.New(rand.NewPCG(4, 61))
	applied := "v1"
	var badAt time.Time // when the bad snapshot was set
	total, over := 0, 0
	for _, step := range peerSteps {
		switch {
		case step.gone:
			m.Stop()
			compareAnswers(t, ctx, "server gone at "+applied, rng, theirs, rl, 10, &over)
			total += 10
			m.Set("upstream", step.name, step.rc)
			m.Set("floodgate", step.name, step.rc)
			m.Restart()
		case step.name != "v1":
			if !badAt.IsZero() {
				// go-control-plane answers each NACK with the same snapshot:
				// floodgate backs off between its NACKs, upstream does not.
				t.Logf("NACKs during the %s of the bad snapshot: envoyproxy/ratelimit %d, floodgate %d",
					time.Since(badAt).Round(time.Millisecond), m.NACKs("upstream"), m.NACKs("floodgate"))
				badAt = time.Time{}
			}
			m.Set("upstream", step.name, step.rc)
			m.Set("floodgate", step.name, step.rc)
		}
		if step.bad {
			badAt = time.Now()
			a := m.NACK()
			if !strings.Contains(a.GetErrorDetail().GetMessage(), "invalid rate limit unit '9'") {
				t.Fatalf("floodgate's NACK of %s: %v", step.name, a.GetErrorDetail())
			}
		} else {
			applied = step.name
		}
		waitProbe(t, ctx, applied, theirs, rl)
		compareAnswers(t, ctx, step.name, rng, theirs, rl, 30, &over)
		total += 30
	}
	t.Logf("%d requests over %d snapshots, %d over the limit", total, len(peerSteps), over)
	if over == 0 || over == total {
		t.Errorf("%d of %d requests over the limit: the sequence tests too little", over, total)
	}
}

// waitProbe waits until both services answer version's probe, which only
// a configuration of that version has, as unlimited.
func waitProbe(t *testing.T, ctx context.Context, version string, theirs rlsv3.RateLimitServiceClient, ours *envoy.Service) {
	t.Helper()
	probe := envoytest.Request("diff", envoytest.Descriptor("version", version))
	deadline := time.Now().Add(20 * time.Second)
	for {
		a, errA := theirs.ShouldRateLimit(ctx, probe)
		b, errB := ours.ShouldRateLimit(ctx, probe)
		if errA == nil && errB == nil && a.Statuses[0].LimitRemaining == math.MaxUint32 && b.Statuses[0].LimitRemaining == math.MaxUint32 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s not applied by both within 20s: envoyproxy/ratelimit %v (%v), floodgate %v (%v)", version, a, errA, b, errB)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// compareAnswers sends n random requests to both services and compares
// the answers, DurationUntilReset within a second.
func compareAnswers(t *testing.T, ctx context.Context, step string, rng *rand.Rand, theirs rlsv3.RateLimitServiceClient, ours *envoy.Service, n int, over *int) {
	t.Helper()
	for i := range n {
		req := peerRequest(rng)
		want, err := theirs.ShouldRateLimit(ctx, req)
		if err != nil {
			t.Fatalf("%s, request %d: envoyproxy/ratelimit: %v", step, i, err)
		}
		got, err := ours.ShouldRateLimit(ctx, req)
		if err != nil {
			t.Fatalf("%s, request %d: floodgate: %v", step, i, err)
		}
		if want.OverallCode == rlsv3.RateLimitResponse_OVER_LIMIT {
			*over++
		}
		w, g := proto.Clone(want).(*rlsv3.RateLimitResponse), proto.Clone(got).(*rlsv3.RateLimitResponse)
		same := len(w.Statuses) == len(g.Statuses)
		for j := 0; same && j < len(w.Statuses); j++ {
			wd, gd := w.Statuses[j].DurationUntilReset.AsDuration(), g.Statuses[j].DurationUntilReset.AsDuration()
			if d := wd - gd; d < -time.Second || d > time.Second {
				same = false
			}
			w.Statuses[j].DurationUntilReset, g.Statuses[j].DurationUntilReset = nil, nil
		}
		if !same || !proto.Equal(w, g) {
			t.Errorf("%s, request %d: %v\nenvoyproxy/ratelimit: %v\nfloodgate:            %v", step, i, req, want, got)
		}
	}
}
