package envoy_test

import (
	"bytes"
	"context"
	"io"
	"math/rand/v2"
	"net/http"
	"os/exec"
	"path/filepath"
	"slices"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/encoding/protojson"

	"github.com/floodgate/floodgate/internal/testkit/peertest"
	"github.com/floodgate/floodgate/internal/testkit/redistest"
)

// TestRatelimitModeSameAnswers runs floodgate's binary as envoyproxy/ratelimit's
// image runs its own: named ratelimit, no flags, and the very environment
// and runtime layout that peertest gives envoyproxy/ratelimit
// (REDIS_SOCKET_TYPE, REDIS_URL, RUNTIME_ROOT/RUNTIME_SUBDIRECTORY/config,
// USE_STATSD, LOG_LEVEL, HOST, PORT, GRPC_PORT, DEBUG_PORT, ...). The
// differential test's random requests then go to both, over gRPC on
// GRPC_PORT, and every fifth one over /json on PORT too: the answers must
// be the same, as in TestSameAnswersAsEnvoyRatelimit.
func TestRatelimitModeSameAnswers(t *testing.T) {
	peertest.Build(t)
	v, err := peertest.Version()
	if err != nil {
		t.Fatal(err)
	}
	have := peerFeaturesOf(t, v)
	domain, ms := diffConfig(have), makersFor(have)
	bin := filepath.Join(t.TempDir(), "ratelimit")
	if out, err := exec.Command("go", "build", "-o", bin, "github.com/floodgate/floodgate/cmd/floodgate").CombinedOutput(); err != nil {
		t.Fatalf("building floodgate as ratelimit: %v\n%s", err, out)
	}
	files := map[string]string{"diff.yaml": domain}
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
			peer := peertest.Start(t, srv.Addr, files, env...)
			// A budget a loaded machine keeps (the default is 50ms): Redis,
			// not the fallback, answers every request, as upstream's does.
			oursEnv := append(slices.Clone(env), "FLOODGATE_BUDGET=5s")
			ours, err := peertest.StartRatelimit(bin, t.TempDir(), srv.Addr, files, func() int { return redistest.FreePort(t) }, oursEnv...)
			if err != nil {
				t.Fatalf("floodgate as ratelimit: %v", err)
			}
			t.Cleanup(ours.Stop)
			theirs, oursRLS := peertest.Client(t, peer.GRPC), peertest.Client(t, ours.GRPC)
			for _, r := range []*peertest.Ratelimit{peer, ours} {
				if code, body := get(t, r.HTTP, "/healthcheck"); code != 200 || body != "OK" {
					t.Errorf("GET /healthcheck on %s: %d %q, want 200 OK", r.HTTP, code, body)
				}
			}
			waitOutWindowEnd(t, time.Minute, 5*time.Second)
			rng := rand.New(rand.NewPCG(2, uint64(len(tc.name))))
			over, differing := 0, 0
			for step := range 400 {
				req := randomRequest(rng, ms, tc.atomic)
				viaJSON := step%5 == 0
				var want, got *rlsv3.RateLimitResponse
				if viaJSON {
					var wantCode, gotCode int
					want, wantCode = postJSON(t, peer.HTTP, req)
					got, gotCode = postJSON(t, ours.HTTP, req)
					if gotCode != wantCode {
						t.Errorf("step %d: POST /json answered %d, envoyproxy/ratelimit %d", step, gotCode, wantCode)
					}
				} else {
					if want, err = theirs.ShouldRateLimit(context.Background(), req); err != nil {
						t.Fatalf("step %d: envoyproxy/ratelimit: %v", step, err)
					}
					if got, err = oursRLS.ShouldRateLimit(context.Background(), req); err != nil {
						t.Fatalf("step %d: floodgate as ratelimit: %v", step, err)
					}
				}
				if want.OverallCode == rlsv3.RateLimitResponse_OVER_LIMIT {
					over++
				}
				if msg := compare(want, got); msg != "" {
					differing++
					if differing <= 5 {
						t.Errorf("step %d (/json %v): %v\n%s\nenvoyproxy/ratelimit: %v\nfloodgate:            %v", step, viaJSON, req, msg, want, got)
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

// postJSON sends req to POST /json at addr and returns the answer and its
// status: 200, or 429 over the limit (the random requests are all valid).
func postJSON(t *testing.T, addr string, req *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, int) {
	t.Helper()
	body, err := protojson.Marshal(req)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.Post("http://"+addr+"/json", "application/json", bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 && resp.StatusCode != 429 {
		t.Fatalf("POST /json to %s: %d %s", addr, resp.StatusCode, b)
	}
	var out rlsv3.RateLimitResponse
	if err := protojson.Unmarshal(b, &out); err != nil {
		t.Fatalf("POST /json to %s: %v: %s", addr, err, b)
	}
	return &out, resp.StatusCode
}

func get(t *testing.T, addr, path string) (int, string) {
	t.Helper()
	c := &http.Client{Timeout: 2 * time.Second}
	resp, err := c.Get("http://" + addr + path)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}
