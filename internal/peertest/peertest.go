// Package peertest builds and starts envoyproxy/ratelimit, the reference
// Envoy rate limit service, from its Go module, for differential tests and
// benchmarks. Outside CI a peer that cannot be built skips the test; in CI
// (CI=true, or FLOODGATE_REQUIRE_PEERS=1) it fails it.
package peertest

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	rls "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/floodgate/floodgate/internal/redistest"
)

// RatelimitVersion is the version of github.com/envoyproxy/ratelimit that
// the tests and rlsbench compare with: its main branch of 2026-07-06
// (f2fb15770f7f), with wildcards anywhere in a value, descriptor
// metadata, and quota_mode's answer of March 2026.
const RatelimitVersion = "v1.4.1-0.20260706065234-f2fb15770f7f"

// SourceEnv names the environment variable that may hold the path of a
// checkout of envoyproxy/ratelimit at RatelimitVersion's commit: the peer
// is then built from it rather than fetched through the Go module proxy,
// for machines whose proxy does not serve that version. Its dependencies
// still come through the proxy.
const SourceEnv = "FLOODGATE_RATELIMIT_SRC"

var (
	buildOnce sync.Once
	buildBin  string
	buildErr  error
)

func required() bool {
	return os.Getenv("CI") == "true" || os.Getenv("FLOODGATE_REQUIRE_PEERS") == "1"
}

// BuildRatelimit returns the path of envoyproxy/ratelimit's service_cmd at
// RatelimitVersion, built with go install (or from $FLOODGATE_RATELIMIT_SRC,
// see SourceEnv) the first time on this machine
// and kept in the user's cache directory (see cacheDir) for later runs:
// one binary per version, where a temporary directory per process left
// 34 MB behind on every run. It builds at most once per process; the
// binary is moved into place whole, so processes that build it side by
// side (go test runs packages in parallel) each find a complete one.
func BuildRatelimit() (string, error) {
	buildOnce.Do(func() {
		buildBin, buildErr = buildRatelimit()
	})
	return buildBin, buildErr
}

func buildRatelimit() (string, error) {
	dir := filepath.Join(cacheDir(), "ratelimit-"+RatelimitVersion)
	bin := filepath.Join(dir, "service_cmd")
	if fi, err := os.Stat(bin); err == nil && fi.Mode().IsRegular() {
		return bin, nil
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	tmp, err := os.MkdirTemp(dir, "build-")
	if err != nil {
		return "", err
	}
	defer os.RemoveAll(tmp)
	cmd := exec.Command("go", "install", "github.com/envoyproxy/ratelimit/src/service_cmd@"+RatelimitVersion)
	cmd.Env = append(os.Environ(), "GOBIN="+tmp, "GOFLAGS=-mod=mod", "GOWORK=off")
	if src := os.Getenv(SourceEnv); src != "" {
		cmd = exec.Command("go", "build", "-o", filepath.Join(tmp, "service_cmd"), "./src/service_cmd")
		cmd.Dir = src
		cmd.Env = append(os.Environ(), "GOFLAGS=-mod=mod", "GOWORK=off")
	}
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("%s envoyproxy/ratelimit %s: %v (set %s to a checkout of it when the module proxy does not serve it)\n%s", cmd.Args[1], RatelimitVersion, err, SourceEnv, out)
	}
	if err := os.Rename(filepath.Join(tmp, "service_cmd"), bin); err != nil {
		return "", err
	}
	return bin, nil
}

// cacheDir is where built peers are kept: floodgate/ under the user's
// cache directory ($XDG_CACHE_HOME, or ~/.cache), or under the temporary
// directory when there is none.
func cacheDir() string {
	if d, err := os.UserCacheDir(); err == nil {
		return filepath.Join(d, "floodgate")
	}
	return filepath.Join(os.TempDir(), "floodgate-cache")
}

// Build is BuildRatelimit for a test: it skips the test when the peer
// cannot be built, or fails it in CI.
func Build(t testing.TB) string {
	t.Helper()
	bin, err := BuildRatelimit()
	if err != nil {
		if required() {
			t.Fatalf("envoyproxy/ratelimit could not be built: %v", err)
		}
		t.Skipf("envoyproxy/ratelimit could not be built; skipping: %v", err)
	}
	return bin
}

// Ratelimit is a running envoyproxy/ratelimit.
type Ratelimit struct {
	GRPC string // its gRPC address
	HTTP string // its HTTP address (POST /json)
	cmd  *exec.Cmd
}

// Start runs envoyproxy/ratelimit against the redis-server at redisAddr,
// with the domain files files (name: YAML) as its runtime configuration
// and env added to its environment (STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT=true,
// ...). It waits until the service answers, and stops it by its PID when
// t ends.
func Start(t testing.TB, redisAddr string, files map[string]string, env ...string) *Ratelimit {
	t.Helper()
	bin := Build(t)
	r, err := StartRatelimit(bin, t.TempDir(), redisAddr, files, func() int { return redistest.FreePort(t) }, env...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(r.Stop)
	return r
}

// StartRatelimit runs the envoyproxy/ratelimit at bin as Start does, with
// its runtime configuration under root and ports from port; Stop stops
// it.
func StartRatelimit(bin, root, redisAddr string, files map[string]string, port func() int, env ...string) (*Ratelimit, error) {
	dir := filepath.Join(root, "ratelimit", "config")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	for name, body := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o644); err != nil {
			return nil, err
		}
	}
	for attempt := 0; ; attempt++ {
		r, err := start(bin, root, redisAddr, port(), port(), port(), env)
		if err == nil || attempt == 3 {
			return r, err
		}
	}
}

func start(bin, root, redisAddr string, port, grpcPort, debugPort int, env []string) (*Ratelimit, error) {
	cmd := exec.Command(bin)
	cmd.Env = append([]string{
		"PATH=" + os.Getenv("PATH"), "HOME=" + os.Getenv("HOME"),
		"USE_STATSD=false", "LOG_LEVEL=warn",
		"REDIS_SOCKET_TYPE=tcp", "REDIS_URL=" + redisAddr,
		"RUNTIME_ROOT=" + root, "RUNTIME_SUBDIRECTORY=ratelimit", "RUNTIME_WATCH_ROOT=false",
		"HOST=127.0.0.1", "GRPC_HOST=127.0.0.1", "DEBUG_HOST=127.0.0.1",
		"PORT=" + strconv.Itoa(port), "GRPC_PORT=" + strconv.Itoa(grpcPort), "DEBUG_PORT=" + strconv.Itoa(debugPort),
	}, env...)
	var logs strings.Builder
	cmd.Stdout, cmd.Stderr = &lockedWriter{b: &logs}, &lockedWriter{b: &logs}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	r := &Ratelimit{GRPC: "127.0.0.1:" + strconv.Itoa(grpcPort), HTTP: "127.0.0.1:" + strconv.Itoa(port), cmd: cmd}
	exited := make(chan struct{})
	go func() { cmd.Wait(); close(exited) }()
	conn, err := grpc.NewClient(r.GRPC, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		r.Stop()
		return nil, err
	}
	defer conn.Close()
	hc := healthpb.NewHealthClient(conn)
	for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline); {
		select {
		case <-exited:
			return nil, fmt.Errorf("envoyproxy/ratelimit exited:\n%s", logs.String())
		default:
		}
		ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
		h, err := hc.Check(ctx, &healthpb.HealthCheckRequest{})
		cancel()
		if err == nil && h.Status == healthpb.HealthCheckResponse_SERVING {
			return r, nil
		}
		time.Sleep(50 * time.Millisecond)
	}
	r.Stop()
	return nil, fmt.Errorf("envoyproxy/ratelimit did not become healthy within 20s:\n%s", logs.String())
}

// PID is the process's ID.
func (r *Ratelimit) PID() int { return r.cmd.Process.Pid }

// Stop kills the process (its process group) by its PID.
func (r *Ratelimit) Stop() {
	if r.cmd != nil && r.cmd.Process != nil {
		syscall.Kill(-r.cmd.Process.Pid, syscall.SIGKILL)
	}
}

// Client returns a gRPC client of a rate limit service at addr, closed
// when t ends.
func Client(t testing.TB, addr string) rls.RateLimitServiceClient {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return rls.NewRateLimitServiceClient(conn)
}

type lockedWriter struct {
	mu sync.Mutex
	b  *strings.Builder
}

func (w *lockedWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.Write(p)
}
