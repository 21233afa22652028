package rls_test

import (
	"bufio"
	"context"
	"log/slog"
	"os"
	"strings"
	"testing"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/encoding/protojson"

	"github.com/floodgate/floodgate"
	"github.com/floodgate/floodgate/internal/config"
	"github.com/floodgate/floodgate/internal/service"
)

// TestWalkthrough loads examples/envoy's configuration and sends the
// requests of its walk-through over gRPC, in order, to a fresh floodgate:
// each answer must be the one the walk-through shows, but for the value
// of durationUntilReset, which depends on the time.
func TestWalkthrough(t *testing.T) {
	cfg, err := config.Load("../../examples/envoy/config")
	if err != nil {
		t.Fatal(err)
	}
	st := floodgate.NewMemoryStore(&floodgate.MemoryOptions{SweepInterval: -1})
	t.Cleanup(func() { st.Close() })
	svc, err := service.New(st, cfg, &service.Options{Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	addr, _ := startGRPC(t, svc)
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	c := rlsv3.NewRateLimitServiceClient(conn)

	f, err := os.Open("../../examples/envoy/README.md")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 1<<20)
	steps := 0
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, "$ curl") {
			continue
		}
		body := line[strings.Index(line, "-d '")+4 : len(line)-1]
		if !sc.Scan() {
			t.Fatalf("no answer after %s", line)
		}
		var req rlsv3.RateLimitRequest
		var want rlsv3.RateLimitResponse
		if err := protojson.Unmarshal([]byte(body), &req); err != nil {
			t.Fatalf("%s: %v", body, err)
		}
		if err := protojson.Unmarshal([]byte(sc.Text()), &want); err != nil {
			t.Fatalf("%s: %v", sc.Text(), err)
		}
		got, err := c.ShouldRateLimit(context.Background(), &req)
		if err != nil {
			t.Fatal(err)
		}
		if g, w := timeless(got), timeless(&want); g != w {
			t.Errorf("%s:\n got %s\nwant %s", body, g, w)
		}
		steps++
	}
	if steps < 5 {
		t.Fatalf("the walk-through has %d requests; the test reads it wrong", steps)
	}
	// And the counters it shows.
	var m strings.Builder
	svc.Metrics.Write(&m)
	for _, want := range []string{
		`ratelimit_service_rate_limit_total_hits{domain="edge",key1="path_/login",key2="remote_address"} 4`,
		`ratelimit_service_rate_limit_over_limit{domain="edge",key1="path_/login",key2="remote_address"} 1`,
	} {
		if !strings.Contains(m.String(), want) {
			t.Errorf("metrics lack %s", want)
		}
	}
}

// timeless is the answer in JSON with durationUntilReset's value hidden.
func timeless(r *rlsv3.RateLimitResponse) string {
	for _, s := range r.Statuses {
		if s.DurationUntilReset != nil {
			s.DurationUntilReset.Seconds = 1
		}
	}
	return protojson.Format(r)
}
