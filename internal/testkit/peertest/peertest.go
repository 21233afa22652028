// Package peertest builds and starts envoyproxy/ratelimit, the reference
// Envoy rate limit service, from its Go module (RatelimitVersion, or
// another version or checkout: see Version), for differential tests and
// benchmarks. Outside CI a peer that cannot be built skips the test; in CI
// (CI=true, or FLOODGATE_REQUIRE_PEERS=1) it fails it.
package peertest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
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

	"github.com/floodgate/floodgate/internal/testkit/redistest"
	"github.com/floodgate/floodgate/internal/testkit/syncbuf"
)

// RatelimitVersion is the version of github.com/envoyproxy/ratelimit that
// the tests and rlsbench compare with by default: its main branch of
// 2026-01-22, the newest commit the Go module proxy serves, so that a
// machine with only Go and the clone can build it. VersionEnv and
// SourceEnv choose another (see Version).
const RatelimitVersion = "v1.4.1-0.20260122083618-3fb702589d36"

// VersionEnv names the environment variable that may hold another
// version of envoyproxy/ratelimit to compare with: a module version or
// pseudo-version, fetched through the module proxy, or built from
// SourceEnv's checkout when that is set too.
const VersionEnv = "FLOODGATE_RATELIMIT_VERSION"

// SourceEnv names the environment variable that may hold the path of a
// checkout of envoyproxy/ratelimit: the peer is then built from it
// rather than fetched through the Go module proxy, for a commit the proxy
// does not serve (upstream's main). Its version is VersionEnv's, or the
// checkout's own commit when it has a .git. Its dependencies still come
// through the proxy.
const SourceEnv = "FLOODGATE_RATELIMIT_SRC"

var (
	versionOnce sync.Once
	version     string
	versionErr  error

	buildOnce sync.Once
	buildBin  string
	buildErr  error
)

func required() bool {
	return os.Getenv("CI") == "true" || os.Getenv("FLOODGATE_REQUIRE_PEERS") == "1"
}

// Version returns the version of envoyproxy/ratelimit that BuildRatelimit
// builds: $FLOODGATE_RATELIMIT_VERSION when set; else, with
// $FLOODGATE_RATELIMIT_SRC set, the pseudo-version of the checkout's
// commit, told by git (an error when the checkout has no .git, no tags or
// uncommitted changes: the version names the binary in the cache);
// else RatelimitVersion.
func Version() (string, error) {
	versionOnce.Do(func() {
		version, versionErr = resolveVersion(os.Getenv(SourceEnv), os.Getenv(VersionEnv))
	})
	return version, versionErr
}

// semverRE is the shape of a module version. Only a valid one may name a
// directory of the cache or follow go install's @.
var semverRE = regexp.MustCompile(`^v[0-9]+\.[0-9]+\.[0-9]+(-[0-9A-Za-z-]+(\.[0-9A-Za-z-]+)*)?(\+[0-9A-Za-z-]+(\.[0-9A-Za-z-]+)*)?$`)

// pseudoCommitRE takes the commit hash from the end of a pseudo-version.
var pseudoCommitRE = regexp.MustCompile(`[.-][0-9]{14}-([0-9a-f]{12})$`)

func resolveVersion(src, v string) (string, error) {
	if v != "" {
		if !semverRE.MatchString(v) {
			return "", fmt.Errorf("%s=%q is not a module version (such as %s)", VersionEnv, v, RatelimitVersion)
		}
		if src != "" {
			if err := checkCommit(src, v); err != nil {
				return "", err
			}
		}
		return v, nil
	}
	if src == "" {
		return RatelimitVersion, nil
	}
	return gitVersion(src)
}

// checkCommit fails when src is a git checkout of another commit than the
// pseudo-version v names: its binary would be cached under a wrong name.
// Where git cannot tell (no .git, no git), it trusts v.
func checkCommit(src, v string) error {
	m := pseudoCommitRE.FindStringSubmatch(v)
	if m == nil {
		return nil
	}
	if _, err := os.Stat(filepath.Join(src, ".git")); err != nil {
		return nil
	}
	head, err := git(src, "rev-parse", "HEAD")
	if err != nil {
		return nil
	}
	if !strings.HasPrefix(head, m[1]) {
		return fmt.Errorf("%s=%s names commit %s, but %s=%s is at %s", VersionEnv, v, m[1], SourceEnv, src, head)
	}
	return nil
}

// gitVersion returns the version the Go command gives the commit checked
// out at src: its tag, or a pseudo-version after the nearest tag
// (vX.Y.(Z+1)-0.yyyymmddhhmmss-hash, committer time in UTC).
func gitVersion(src string) (string, error) {
	need := fmt.Sprintf("set %s to its version", VersionEnv)
	if _, err := os.Stat(filepath.Join(src, ".git")); err != nil {
		return "", fmt.Errorf("%s=%s has no .git to tell its commit: %s", SourceEnv, src, need)
	}
	if st, err := git(src, "status", "--porcelain", "--untracked-files=no"); err != nil {
		return "", fmt.Errorf("%s=%s: %v: %s", SourceEnv, src, err, need)
	} else if st != "" {
		return "", fmt.Errorf("%s=%s has uncommitted changes, which no version names: %s", SourceEnv, src, need)
	}
	if tag, err := git(src, "describe", "--tags", "--exact-match", "--match", "v[0-9]*", "HEAD"); err == nil && semverRE.MatchString(tag) {
		return tag, nil
	}
	hash, err := git(src, "rev-parse", "--short=12", "HEAD")
	if err != nil {
		return "", fmt.Errorf("%s=%s: %v: %s", SourceEnv, src, err, need)
	}
	when, err := git(src, "show", "-s", "--format=%cd", "--date=format-local:%Y%m%d%H%M%S", "HEAD")
	if err != nil {
		return "", fmt.Errorf("%s=%s: %v: %s", SourceEnv, src, err, need)
	}
	tag, err := git(src, "describe", "--tags", "--abbrev=0", "--match", "v[0-9]*", "HEAD")
	if err != nil || !semverRE.MatchString(tag) || strings.Contains(tag, "+") {
		return "", fmt.Errorf("%s=%s has no version tag before its commit (a shallow clone?): %s", SourceEnv, src, need)
	}
	if strings.Contains(tag, "-") { // a pre-release: vX.Y.Z-pre.0.time-hash
		return tag + ".0." + when + "-" + hash, nil
	}
	i := strings.LastIndexByte(tag, '.') + 1
	patch, err := strconv.Atoi(tag[i:])
	if err != nil {
		return "", fmt.Errorf("%s=%s: tag %s: %v: %s", SourceEnv, src, tag, err, need)
	}
	return fmt.Sprintf("%s%d-0.%s-%s", tag[:i], patch+1, when, hash), nil
}

// git runs git in dir and returns its trimmed output; times are UTC.
func git(dir string, args ...string) (string, error) {
	cmd := exec.Command("git", append([]string{"-C", dir}, args...)...)
	cmd.Env = append(os.Environ(), "TZ=UTC")
	out, err := cmd.Output()
	if err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			return "", fmt.Errorf("git %s: %v: %s", strings.Join(args, " "), err, bytes.TrimSpace(ee.Stderr))
		}
		return "", fmt.Errorf("git %s: %w", strings.Join(args, " "), err)
	}
	return strings.TrimSpace(string(out)), nil
}

// BuildRatelimit returns the path of envoyproxy/ratelimit's service_cmd at
// Version, built the first time on this machine, with go install through
// the module proxy or from $FLOODGATE_RATELIMIT_SRC (see SourceEnv), and
// kept in the user's cache directory (see cacheDir) for later runs:
// one binary per version, so versions coexist and a cached one is not
// built again, even from a checkout. It builds at most once per process;
// the binary is moved into place whole, so processes that build it side
// by side (go test runs packages in parallel) each find a complete one.
func BuildRatelimit() (string, error) {
	buildOnce.Do(func() {
		buildBin, buildErr = buildRatelimit()
	})
	return buildBin, buildErr
}

func buildRatelimit() (string, error) {
	v, err := Version()
	if err != nil {
		return "", err
	}
	dir := filepath.Join(cacheDir(), "ratelimit-"+v)
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
	cmd := exec.Command("go", "install", "github.com/envoyproxy/ratelimit/src/service_cmd@"+v)
	cmd.Env = append(os.Environ(), "GOBIN="+tmp, "GOFLAGS=-mod=mod", "GOWORK=off")
	hint := fmt.Sprintf("when the module proxy does not serve it, set %s to a checkout of it", SourceEnv)
	if src := os.Getenv(SourceEnv); src != "" {
		// No VCS stamp: a copy without .git builds too.
		cmd = exec.Command("go", "build", "-o", filepath.Join(tmp, "service_cmd"), "./src/service_cmd")
		cmd.Dir = src
		cmd.Env = append(os.Environ(), "GOFLAGS=-mod=mod -buildvcs=false", "GOWORK=off")
		hint = fmt.Sprintf("built from %s=%s", SourceEnv, src)
	}
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("%s envoyproxy/ratelimit %s: %v (%s)\n%s", cmd.Args[1], v, err, hint, out)
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
	// One locked buffer for both: the process writes them from two
	// goroutines of exec's.
	var logs syncbuf.Buffer
	cmd.Stdout, cmd.Stderr = &logs, &logs
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
