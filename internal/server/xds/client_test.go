package xds_test

import (
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	rlsconf "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"
	"go.uber.org/goleak"

	"github.com/floodgate/floodgate"
	"github.com/floodgate/floodgate/internal/server/config"
	"github.com/floodgate/floodgate/internal/server/envoy"
	"github.com/floodgate/floodgate/internal/server/service"
	"github.com/floodgate/floodgate/internal/server/xds"
	"github.com/floodgate/floodgate/internal/testkit/envoytest"
	"github.com/floodgate/floodgate/internal/testkit/xdstest"
	"github.com/floodgate/floodgate/storetest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// edge is a domain of one limit on remote_address, of rpu a minute, and
// one of 1 a minute on path /login.
func edge(rpu uint32) *rlsconf.RateLimitConfig {
	return &rlsconf.RateLimitConfig{Name: "edge", Domain: "edge", Descriptors: []*rlsconf.RateLimitDescriptor{
		{Key: "remote_address", RateLimit: &rlsconf.RateLimitPolicy{Unit: rlsconf.RateLimitUnit_MINUTE, RequestsPerUnit: rpu}},
		{Key: "path", Value: "/login", RateLimit: &rlsconf.RateLimitPolicy{Unit: rlsconf.RateLimitUnit_MINUTE, RequestsPerUnit: 1}},
	}}
}

// newService is an Envoy service on a memory store at a fixed instant,
// 10s into a minute, with no domains until xDS sends them.
func newService(t *testing.T) *envoy.Service {
	t.Helper()
	now := storetest.Base.Add(10 * time.Second)
	st := floodgate.NewMemoryStore(&floodgate.MemoryOptions{Clock: storetest.NewClock(now), SweepInterval: -1})
	t.Cleanup(func() { st.Close() })
	empty, err := config.FromDomains(xds.Source, nil, false)
	if err != nil {
		t.Fatal(err)
	}
	rl, err := envoy.New(st, empty, &service.Options{Logger: slog.New(slog.DiscardHandler)}, &envoy.Options{Now: func() time.Time { return now }})
	if err != nil {
		t.Fatal(err)
	}
	return rl
}

// hit sends one hit of remote_address=value in domain edge and returns
// the answer's code and limit remaining.
func hit(t *testing.T, rl *envoy.Service, key, value string) (rlsv3.RateLimitResponse_Code, uint32) {
	t.Helper()
	resp, err := rl.ShouldRateLimit(context.Background(), envoytest.Request("edge", envoytest.Descriptor(key, value)))
	if err != nil {
		t.Fatal(err)
	}
	return resp.OverallCode, resp.Statuses[0].LimitRemaining
}

// backoffClock hands the client's backoff waits to the test, which lets
// each retry go with tick.
type backoffClock struct {
	waits chan time.Duration
	tick  chan time.Time
}

func newBackoffClock() *backoffClock {
	return &backoffClock{waits: make(chan time.Duration, 16), tick: make(chan time.Time)}
}

func (b *backoffClock) after(d time.Duration) <-chan time.Time {
	b.waits <- d
	return b.tick
}

func (b *backoffClock) wait(t *testing.T) time.Duration {
	t.Helper()
	select {
	case d := <-b.waits:
		return d
	case <-time.After(10 * time.Second):
		t.Fatal("the client did not back off within 10s")
		return 0
	}
}

func waitApplied(t *testing.T, applied <-chan error) error {
	t.Helper()
	select {
	case err := <-applied:
		return err
	case <-time.After(10 * time.Second):
		t.Fatal("no configuration applied within 10s")
		return nil
	}
}

// TestClientUpdates runs a client against go-control-plane's management
// server through the life of a subscription: the initial configuration,
// an update that keeps the counters, a bad one NACKed with its reason
// while the last good one stays, and the server gone and back with a new
// version.
func TestClientUpdates(t *testing.T) {
	m := xdstest.Start(t, xdstest.Options{})
	rl := newService(t)
	applied := make(chan error, 16)
	bc := newBackoffClock()
	const backoffMin, backoffMax = 100 * time.Millisecond, 300 * time.Millisecond
	c, err := xds.Start(xds.Options{
		Server: m.Addr, NodeID: "node-1", NodeMetadata: map[string]string{"cluster": "edge"},
		BackoffMin: backoffMin, BackoffMax: backoffMax, After: bc.after, Logger: slog.New(slog.DiscardHandler),
		Apply: func(cfg *config.Config, err error) error {
			err = rl.Rules().Apply(xds.Source, cfg, err)
			applied <- err
			return err
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Stop()

	// Initial: the subscription names the node and the type.
	sub := m.Subscription()
	if sub.GetNode().GetId() != "node-1" || sub.GetTypeUrl() != xds.TypeURL || sub.GetVersionInfo() != "" ||
		sub.GetNode().GetMetadata().GetFields()["cluster"].GetStringValue() != "edge" {
		t.Fatalf("subscription: %v", sub)
	}
	m.Set("node-1", "v1", edge(5))
	if err := waitApplied(t, applied); err != nil {
		t.Fatal(err)
	}
	if a := m.Answer(); a.GetVersionInfo() != "v1" || a.GetErrorDetail() != nil {
		t.Fatalf("answer to v1: %v, want an ACK of v1", a)
	}
	for i, want := range []uint32{4, 3, 2} {
		if code, left := hit(t, rl, "remote_address", "a"); code != rlsv3.RateLimitResponse_OK || left != want {
			t.Fatalf("v1 hit %d: %v, %d left; want OK, %d", i, code, left, want)
		}
	}

	// Update: a higher limit counts on from the hits so far.
	m.Set("node-1", "v2", edge(10))
	if err := waitApplied(t, applied); err != nil {
		t.Fatal(err)
	}
	if a := m.Answer(); a.GetVersionInfo() != "v2" || a.GetErrorDetail() != nil {
		t.Fatalf("answer to v2: %v, want an ACK of v2", a)
	}
	if code, left := hit(t, rl, "remote_address", "a"); code != rlsv3.RateLimitResponse_OK || left != 6 {
		t.Fatalf("v2: %v, %d left; want OK, 6: the 3 hits under v1 and this one", code, left)
	}

	// A bad resource: NACKed with the reason, v2 kept.
	bad := edge(10)
	bad.Descriptors[1].RateLimit.Unit = 9
	m.Set("node-1", "v3", bad)
	if err := waitApplied(t, applied); err == nil {
		t.Fatal("v3 applied; want it refused")
	}
	a := m.Answer()
	want := `xDS resource "edge": descriptors[1].rate_limit.unit: invalid rate limit unit '9'`
	if a.GetErrorDetail() == nil || !strings.Contains(a.GetErrorDetail().GetMessage(), want) || a.GetVersionInfo() != "v2" || a.GetResponseNonce() == "" {
		t.Fatalf("answer to v3: %v, want a NACK at v2 saying %q", a, want)
	}
	if code, left := hit(t, rl, "remote_address", "a"); code != rlsv3.RateLimitResponse_OK || left != 5 {
		t.Fatalf("after the NACK: %v, %d left; want OK, 5 under v2", code, left)
	}
	if st := c.Status(); st.Version != "v2" || st.Applied != 2 || st.Rejected != 1 || !strings.Contains(st.LastError, want) || !st.Connected {
		t.Fatalf("status %+v", st)
	}
	// go-control-plane's cache sends v3 again at once: the client waits
	// before it NACKs it again, unapplied, and gets the next version in
	// answer.
	if d := bc.wait(t); d < backoffMin/2 || d > backoffMin {
		t.Fatalf("wait before the repeated NACK %s, want %s to %s", d, backoffMin/2, backoffMin)
	}
	m.Set("node-1", "v4", edge(15))
	bc.tick <- time.Now()
	if a := m.Answer(); a.GetErrorDetail() == nil || !strings.Contains(a.GetErrorDetail().GetMessage(), want) || a.GetVersionInfo() != "v2" {
		t.Fatalf("answer to v3 again: %v, want a NACK at v2 saying %q", a, want)
	}
	if err := waitApplied(t, applied); err != nil {
		t.Fatal(err)
	}
	if a := m.Answer(); a.GetVersionInfo() != "v4" || a.GetErrorDetail() != nil {
		t.Fatalf("answer to v4: %v, want an ACK of v4", a)
	}
	if st := c.Status(); st.Version != "v4" || st.Applied != 3 || st.Rejected != 1 || st.LastError != "" {
		t.Fatalf("status after v4: %+v", st)
	}
	if code, left := hit(t, rl, "remote_address", "a"); code != rlsv3.RateLimitResponse_OK || left != 9 {
		t.Fatalf("v4: %v, %d left; want OK, 9: 6 hits under 15", code, left)
	}

	// The server gone: the client backs off, within its bounds, more each
	// time, and decisions go on under v4.
	m.Stop()
	if d := bc.wait(t); d < backoffMin/2 || d > backoffMin {
		t.Fatalf("first backoff %s, want %s to %s", d, backoffMin/2, backoffMin)
	}
	if st := c.Status(); st.Connected || st.Version != "v4" || st.LastError == "" {
		t.Fatalf("status with the server gone: %+v", st)
	}
	if code, left := hit(t, rl, "remote_address", "a"); code != rlsv3.RateLimitResponse_OK || left != 8 {
		t.Fatalf("server gone: %v, %d left; want OK, 8 under v4", code, left)
	}
	for i, hi := range []time.Duration{2 * backoffMin, backoffMax, backoffMax} {
		bc.tick <- time.Now() // the retry fails: the server is still gone
		if d := bc.wait(t); d < hi/2 || d > hi {
			t.Fatalf("backoff %d: %s, want %s to %s", i+2, d, hi/2, hi)
		}
	}

	// Back, with a new version: the client subscribes at v4 and gets v5.
	m.Set("node-1", "v5", edge(20))
	m.Restart()
	bc.tick <- time.Now()
	if sub := m.Subscription(); sub.GetVersionInfo() != "v4" {
		t.Fatalf("resubscription at %q, want v4", sub.GetVersionInfo())
	}
	if err := waitApplied(t, applied); err != nil {
		t.Fatal(err)
	}
	if a := m.Answer(); a.GetVersionInfo() != "v5" || a.GetErrorDetail() != nil {
		t.Fatalf("answer to v5: %v, want an ACK of v5", a)
	}
	if code, left := hit(t, rl, "remote_address", "a"); code != rlsv3.RateLimitResponse_OK || left != 12 {
		t.Fatalf("v5: %v, %d left; want OK, 12: 8 hits under 20", code, left)
	}
	if code, _ := hit(t, rl, "path", "/login"); code != rlsv3.RateLimitResponse_OK {
		t.Fatalf("path /login: %v", code)
	}
	if code, _ := hit(t, rl, "path", "/login"); code != rlsv3.RateLimitResponse_OVER_LIMIT {
		t.Fatalf("path /login again: %v, want OVER_LIMIT", code)
	}
}

// TestClientStop stops a client in each of its states: connecting to a
// server that is not there, waiting out a backoff, and on an open stream.
// goleak (TestMain) checks that nothing is left running.
func TestClientStop(t *testing.T) {
	for _, tc := range []struct {
		name string
		run  func(t *testing.T, m *xdstest.Server, bc *backoffClock)
	}{
		{"backing off", func(t *testing.T, m *xdstest.Server, bc *backoffClock) {
			m.Stop()
		}},
		{"streaming", func(t *testing.T, m *xdstest.Server, bc *backoffClock) {
			m.Set("n", "v1", edge(1))
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := xdstest.Start(t, xdstest.Options{})
			bc := newBackoffClock()
			tc.run(t, m, bc)
			c, err := xds.Start(xds.Options{Server: m.Addr, NodeID: "n", After: bc.after, Logger: slog.New(slog.DiscardHandler),
				Apply: func(*config.Config, error) error { return nil }})
			if err != nil {
				t.Fatal(err)
			}
			if tc.name == "backing off" {
				bc.wait(t)
			} else {
				m.Answer()
			}
			c.Stop()
		})
	}
}

func TestStartRefuses(t *testing.T) {
	apply := func(*config.Config, error) error { return nil }
	for _, tc := range []struct {
		name string
		o    xds.Options
		want string
	}{
		{"no server", xds.Options{Apply: apply}, "no server address"},
		{"no apply", xds.Options{Server: "127.0.0.1:1"}, "no Apply"},
		{"negative size", xds.Options{Server: "127.0.0.1:1", Apply: apply, MaxMsgSize: -1}, "negative MaxMsgSize"},
		{"max below min", xds.Options{Server: "127.0.0.1:1", Apply: apply, BackoffMin: time.Second, BackoffMax: time.Millisecond}, "below its minimum"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := xds.Start(tc.o)
			if err == nil {
				c.Stop()
				t.Fatal("started")
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %q, want %q in it", err, tc.want)
			}
		})
	}
}
