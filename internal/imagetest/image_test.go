package imagetest

import (
	"bytes"
	"context"
	"debug/elf"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/floodgate/floodgate/internal/testkit/envoytest"
	"github.com/floodgate/floodgate/internal/testkit/nettest"
	"github.com/floodgate/floodgate/internal/testkit/peertest"
	"github.com/floodgate/floodgate/internal/testkit/redistest"
	"github.com/floodgate/floodgate/internal/testkit/syncbuf"
)

// maxImageBytes bounds the image's files: a static binary, CA certificates
// and a rules file.
const maxImageBytes = 30 << 20

// stopWithin is how soon the container must exit after SIGTERM: well
// inside the grace period Kubernetes gives (30s by default).
const stopWithin = 2 * time.Second

// imageConfig is the part of an OCI image configuration the test reads.
type imageConfig struct {
	User         string
	Env          []string
	Entrypoint   []string
	Cmd          []string
	ExposedPorts map[string]struct{}
	Labels       map[string]string
	StopSignal   string
}

func TestImage(t *testing.T) {
	if os.Getenv("FLOODGATE_IMAGE_TEST") != "1" {
		t.Skip("set FLOODGATE_IMAGE_TEST=1 after scripts/image to check the container image (scripts/test does)")
	}
	for _, bin := range []string{"buildah", "runc"} {
		if _, err := exec.LookPath(bin); err != nil {
			t.Fatalf("%s not found: install it (Debian: apt-get install buildah runc); scripts/test does", bin)
		}
	}
	image := os.Getenv("FLOODGATE_IMAGE")
	if image == "" {
		image = "localhost/floodgate:dev"
	}
	cfg := inspect(t, image)
	checkConfig(t, cfg)
	rootfs := mountImage(t, image)
	checkFiles(t, rootfs)
	// The binary is stamped with the version the labels give.
	if v := string(cmd(t, filepath.Join(rootfs, "usr/local/bin/floodgate"), "version")); !strings.Contains(v, cfg.Labels["org.opencontainers.image.version"]) {
		t.Errorf("floodgate version prints %q, but the image's label is version %q", v, cfg.Labels["org.opencontainers.image.version"])
	}

	redis := redistest.Start(t)
	for _, tc := range []struct {
		name      string
		env       []string
		store     string // what serve prints of its store
		configMap bool   // mount a rules directory as the kubelet does, and update it
	}{
		{name: "embedded", store: "embedded in-memory store"},
		{name: "redis", env: []string{"FLOODGATE_REDIS=redis://" + redis.Addr}, store: "Redis at " + redis.Addr},
		{name: "configmap", env: []string{"FLOODGATE_WATCH=100ms"}, store: "embedded in-memory store", configMap: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var rules *configMapDir
			if tc.configMap {
				rules = newConfigMapDir(t, imageRules(t, rootfs))
			}
			c := run(t, rootfs, cfg, tc.env, rules)
			c.checkServes(t)
			if rules != nil {
				rules.update(t, "rules:\n  - name: fresh\n    algorithm: token-bucket\n    rate: 5\n    period: 1s\n    burst: 5\n")
				c.waitRule(t, "fresh")
			}
			c.checkProcess(t)
			if !strings.Contains(c.stdout.String(), "store: "+tc.store) {
				t.Errorf("serve's banner does not name the store %q:\n%s", tc.store, c.stdout.String())
			}
			if tc.name == "redis" {
				n, err := redis.Client(t).DBSize(context.Background()).Result()
				if err != nil || n == 0 {
					t.Errorf("Redis holds %d keys after a check through the container (%v): it did not use Redis", n, err)
				}
			}
			c.checkStops(t)
		})
	}
	t.Run("envoy-gateway", func(t *testing.T) { testEnvoyGateway(t, rootfs, cfg, redis.Addr) })
}

// egDomain is a domain file as Envoy Gateway writes its rate limit
// configuration: the domain is the listener's name, a route rule's match
// the descriptor.
func egDomain(rpu int) string {
	return fmt.Sprintf(`domain: default/eg/http
descriptors:
  - key: httproute/default/ratelimit/rule/0/match/0
    value: httproute/default/ratelimit/rule/0/match/0
    rate_limit:
      unit: Hour
      requests_per_unit: %d
`, rpu)
}

// testEnvoyGateway runs the image as Envoy Gateway's rate limit Deployment
// runs envoyproxy/ratelimit (internal/infrastructure/kubernetes/ratelimit
// in envoyproxy/gateway: its file-configured generation's command, env and
// ConfigMap mount at /data/ratelimit/config, with today's readiness probe
// on /healthcheck and StatsD over TCP to its statsd-exporter sidecar):
// command /bin/ratelimit, no flags. The host's network is shared, so HOST,
// PORT, GRPC_PORT and DEBUG_PORT move it to free loopback ports, and
// REDIS_URL and STATSD_PORT point at the test's servers.
func testEnvoyGateway(t *testing.T, rootfs string, img imageConfig, redisAddr string) {
	statsdPort, lines := nettest.TCPLines(t, 1000)
	httpPort, grpcPort, debugPort := redistest.FreePort(t), redistest.FreePort(t), redistest.FreePort(t)
	env := []string{
		// The Deployment's.
		"REDIS_SOCKET_TYPE=tcp", "REDIS_URL=" + redisAddr,
		"RUNTIME_ROOT=/data", "RUNTIME_SUBDIRECTORY=ratelimit", "RUNTIME_IGNOREDOTFILES=true", "RUNTIME_WATCH_ROOT=false",
		"LOG_LEVEL=info", "USE_STATSD=true", "STATSD_PORT=" + statsdPort,
		// The test's.
		"HOST=127.0.0.1", "GRPC_HOST=127.0.0.1", "DEBUG_HOST=127.0.0.1", "STATSD_HOST=127.0.0.1",
		fmt.Sprintf("PORT=%d", httpPort), fmt.Sprintf("GRPC_PORT=%d", grpcPort), fmt.Sprintf("DEBUG_PORT=%d", debugPort),
	}
	rules := newConfigMapDir(t, egDomain(3))
	c := runProcess(t, rootfs, img, runOptions{args: []string{"/bin/ratelimit"}, env: env, rules: rules, rulesAt: "/data/ratelimit/config",
		http: fmt.Sprintf("127.0.0.1:%d", httpPort), ready: "/healthcheck"})
	if code, body, err := get(c.http, "/healthcheck"); err != nil || code != 200 || body != "OK" {
		t.Errorf("GET /healthcheck: %d %q (%v), want 200 OK", code, body, err)
	}
	rl := peertest.Client(t, fmt.Sprintf("127.0.0.1:%d", grpcPort))
	ask := func() *rlsv3.RateLimitResponse {
		t.Helper()
		route := "httproute/default/ratelimit/rule/0/match/0"
		resp, err := rl.ShouldRateLimit(context.Background(), envoytest.Request("default/eg/http", envoytest.Descriptor(route, route)))
		if err != nil {
			t.Fatalf("ShouldRateLimit: %v\nstderr:\n%s", err, c.stderr.String())
		}
		return resp
	}
	for i, want := range []rlsv3.RateLimitResponse_Code{rlsv3.RateLimitResponse_OK, rlsv3.RateLimitResponse_OK, rlsv3.RateLimitResponse_OK, rlsv3.RateLimitResponse_OVER_LIMIT} {
		if got := ask(); got.OverallCode != want {
			t.Errorf("request %d: %v, want %v", i, got, want)
		}
	}
	// The kubelet updates the ConfigMap: the new limit applies.
	rules.update(t, egDomain(10))
	deadline := time.Now().Add(15 * time.Second)
	for ask().Statuses[0].GetCurrentLimit().GetRequestsPerUnit() != 10 {
		if time.Now().After(deadline) {
			t.Fatalf("the updated ConfigMap was not applied within 15s\nstderr:\n%s", c.stderr.String())
		}
		time.Sleep(100 * time.Millisecond) // polling a real process
	}
	c.checkProcess(t)
	c.checkStops(t)
	// Its statistics reached the statsd-exporter, over TCP, under
	// envoyproxy/ratelimit's names (the last ones sent at SIGTERM).
	want := "ratelimit.service.rate_limit.default/eg/http.httproute/default/ratelimit/rule/0/match/0_httproute/default/ratelimit/rule/0/match/0.total_hits:"
	timeout := time.After(10 * time.Second)
	var got []string
	for {
		select {
		case l := <-lines:
			got = append(got, l)
			if strings.HasPrefix(l, want) {
				return
			}
		case <-timeout:
			t.Fatalf("no StatsD line %s... in %q", want, got)
		}
	}
}

// inspect returns the image's configuration.
func inspect(t *testing.T, image string) imageConfig {
	t.Helper()
	out := cmd(t, "buildah", "inspect", "--type", "image", image)
	var v struct {
		OCIv1 struct{ Config imageConfig } `json:"OCIv1"`
	}
	if err := json.Unmarshal(out, &v); err != nil {
		t.Fatalf("buildah inspect %s: %v", image, err)
	}
	return v.OCIv1.Config
}

// checkConfig checks the user, entrypoint, ports, defaults and labels.
func checkConfig(t *testing.T, c imageConfig) {
	t.Helper()
	if c.User != "65532:65532" {
		t.Errorf("User = %q, want the numeric non-root 65532:65532", c.User)
	}
	if got := strings.Join(append(c.Entrypoint, c.Cmd...), " "); got != "/usr/local/bin/floodgate serve" {
		t.Errorf("entrypoint and cmd = %q, want /usr/local/bin/floodgate serve", got)
	}
	for _, p := range []string{"8080/tcp", "6380/tcp", "8081/tcp"} {
		if _, ok := c.ExposedPorts[p]; !ok {
			t.Errorf("port %s not exposed: %v", p, c.ExposedPorts)
		}
	}
	for _, kv := range []string{"FLOODGATE_HTTP=:8080", "FLOODGATE_RESP=:6380", "FLOODGATE_GRPC=:8081", "FLOODGATE_CONFIG=/etc/floodgate/rules.yaml"} {
		if !contains(c.Env, kv) {
			t.Errorf("env lacks %s: %v", kv, c.Env)
		}
	}
	for _, l := range []string{"version", "revision", "source", "licenses", "title", "description"} {
		if c.Labels["org.opencontainers.image."+l] == "" {
			t.Errorf("label org.opencontainers.image.%s missing", l)
		}
	}
	if c.StopSignal != "SIGTERM" {
		t.Errorf("StopSignal = %q, want SIGTERM", c.StopSignal)
	}
}

// mountImage returns the root filesystem of a working container made from
// image, removed when t ends.
func mountImage(t *testing.T, image string) string {
	t.Helper()
	ctr := strings.TrimSpace(string(cmd(t, "buildah", "from", "--pull-never", "--name", fmt.Sprintf("floodgate-imagetest-%d", os.Getpid()), image)))
	t.Cleanup(func() { exec.Command("buildah", "rm", ctr).Run() })
	root := strings.TrimSpace(string(cmd(t, "buildah", "mount", ctr)))
	t.Cleanup(func() { exec.Command("buildah", "umount", ctr).Run() })
	return root
}

// checkFiles checks that the image holds what it should and is small, and
// that the binary is static (scratch has no C library).
func checkFiles(t *testing.T, root string) {
	t.Helper()
	var total int64
	var files []string
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.Type().IsRegular() {
			info, err := d.Info()
			if err != nil {
				return err
			}
			total += info.Size()
			rel, _ := filepath.Rel(root, p)
			files = append(files, rel)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("image: %d files, %d bytes: %v", len(files), total, files)
	if total > maxImageBytes {
		t.Errorf("the image's files take %d bytes, more than %d", total, maxImageBytes)
	}
	// envoyproxy/ratelimit's command in the manifests that run it.
	if target, err := os.Readlink(filepath.Join(root, "bin/ratelimit")); err != nil || target != "/usr/local/bin/floodgate" {
		t.Errorf("/bin/ratelimit links to %q (%v), want /usr/local/bin/floodgate", target, err)
	}
	for _, want := range []string{"usr/local/bin/floodgate", "etc/ssl/certs/ca-certificates.crt", "etc/floodgate/rules.yaml"} {
		if !contains(files, want) {
			t.Errorf("the image lacks /%s", want)
		}
	}
	f, err := elf.Open(filepath.Join(root, "usr/local/bin/floodgate"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP || p.Type == elf.PT_DYNAMIC {
			t.Errorf("floodgate is dynamically linked (program header %v): build it with CGO_ENABLED=0", p.Type)
		}
	}
}

// container is a floodgate container that runc runs.
type container struct {
	id, bundle     string
	http           string // 127.0.0.1:port
	cmd            *exec.Cmd
	stdout, stderr *syncbuf.Buffer
	done           chan error // runc run's exit
}

// run runs the image's entrypoint in a runc container on the host's
// network, on a read-only root, as the image's user, with env added to the
// image's; the listeners move to free loopback ports. It is deleted when t
// ends.
func run(t *testing.T, rootfs string, img imageConfig, env []string, rules *configMapDir) *container {
	t.Helper()
	httpAddr := fmt.Sprintf("127.0.0.1:%d", redistest.FreePort(t))
	env = append([]string{
		"FLOODGATE_HTTP=" + httpAddr,
		fmt.Sprintf("FLOODGATE_RESP=127.0.0.1:%d", redistest.FreePort(t)),
		fmt.Sprintf("FLOODGATE_GRPC=127.0.0.1:%d", redistest.FreePort(t)),
	}, env...)
	return runProcess(t, rootfs, img, runOptions{env: env, rules: rules, rulesAt: "/etc/floodgate", http: httpAddr, ready: "/healthz"})
}

// runOptions say what runProcess runs.
type runOptions struct {
	args    []string // the process; default the image's entrypoint and cmd
	env     []string // added to the image's
	rules   *configMapDir
	rulesAt string // where rules is mounted, read-only
	http    string // the HTTP listener's address, for ready
	ready   string // the path that answers 200 once serving
}

// runProcess runs a process of the image in a runc container as run
// does, and waits for its o.ready to answer.
func runProcess(t *testing.T, rootfs string, img imageConfig, o runOptions) *container {
	t.Helper()
	c := &container{
		id:     fmt.Sprintf("floodgate-imagetest-%d-%d", os.Getpid(), time.Now().UnixNano()),
		bundle: t.TempDir(),
		http:   o.http,
		stdout: &syncbuf.Buffer{}, stderr: &syncbuf.Buffer{},
		done: make(chan error, 1),
	}
	args := o.args
	if args == nil {
		args = append(append([]string{}, img.Entrypoint...), img.Cmd...)
	}
	writeSpec(t, c.bundle, rootfs, img, args, o.env, o.rules, o.rulesAt)
	c.cmd = exec.Command("runc", "run", "--bundle", c.bundle, c.id)
	c.cmd.Stdout, c.cmd.Stderr = c.stdout, c.stderr
	if err := c.cmd.Start(); err != nil {
		t.Fatalf("runc run: %v", err)
	}
	go func() { c.done <- c.cmd.Wait() }()
	t.Cleanup(func() {
		exec.Command("runc", "delete", "--force", c.id).Run()
		select {
		case <-c.done:
		case <-time.After(10 * time.Second):
			c.cmd.Process.Kill()
			<-c.done
		}
		if t.Failed() {
			t.Logf("container stdout:\n%s\nstderr:\n%s", c.stdout.String(), c.stderr.String())
		}
	})
	// Ready when it answers, within 20s (a loaded machine).
	deadline := time.Now().Add(20 * time.Second)
	for {
		if code, _, err := get(c.http, o.ready); err == nil && code == 200 {
			return c
		}
		select {
		case err := <-c.done:
			c.done <- err
			t.Fatalf("the container exited before serving: %v\nstdout:\n%s\nstderr:\n%s", err, c.stdout.String(), c.stderr.String())
		case <-time.After(50 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s did not answer within 20s\nstdout:\n%s\nstderr:\n%s", o.ready, c.stdout.String(), c.stderr.String())
		}
	}
}

// writeSpec writes the bundle's config.json: runc's default spec with the
// process args, no rlimits (this VM's kernel refuses setrlimit to the
// runtime), no capabilities, no network namespace, a read-only root, and
// rules, when set, mounted read-only on rulesAt.
func writeSpec(t *testing.T, bundle, rootfs string, img imageConfig, args, env []string, rules *configMapDir, rulesAt string) {
	t.Helper()
	cmd(t, "runc", "spec", "--bundle", bundle)
	path := filepath.Join(bundle, "config.json")
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var spec map[string]any
	if err := json.Unmarshal(raw, &spec); err != nil {
		t.Fatal(err)
	}
	uid, gid := userIDs(t, img.User)
	proc := spec["process"].(map[string]any)
	proc["terminal"] = false
	proc["args"] = args
	proc["env"] = mergeEnv(img.Env, env)
	proc["user"] = map[string]any{"uid": uid, "gid": gid}
	proc["cwd"] = "/"
	proc["noNewPrivileges"] = true
	delete(proc, "rlimits")
	proc["capabilities"] = map[string]any{"bounding": []string{}, "effective": []string{}, "permitted": []string{}, "ambient": []string{}}
	spec["root"] = map[string]any{"path": rootfs, "readonly": true}
	if rules != nil {
		spec["mounts"] = append(spec["mounts"].([]any), map[string]any{
			"destination": rulesAt, "type": "bind", "source": rules.dir, "options": []string{"rbind", "ro"}})
	}
	linux := spec["linux"].(map[string]any)
	var ns []any
	for _, n := range linux["namespaces"].([]any) {
		if n.(map[string]any)["type"] != "network" {
			ns = append(ns, n)
		}
	}
	linux["namespaces"] = ns
	out, err := json.MarshalIndent(spec, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, out, 0o644); err != nil {
		t.Fatal(err)
	}
}

// checkServes checks the probes' endpoints and one decision on the image's
// rules.
func (c *container) checkServes(t *testing.T) {
	t.Helper()
	for _, tc := range []struct {
		path string
		want string
	}{
		{"/healthz", `"status":"ok"`},
		{"/readyz", `"status":"ready"`},
		{"/ui/", "<html"},
	} {
		code, body, err := get(c.http, tc.path)
		if err != nil || code != 200 || !strings.Contains(body, tc.want) {
			t.Errorf("GET %s: %d %q (%v), want 200 with %s", tc.path, code, body, err, tc.want)
		}
	}
	// The image's rules are examples/rules.yaml: "api" is 100 a minute.
	resp, err := http.Post("http://"+c.http+"/v1/check", "application/json", strings.NewReader(`{"rule":"api","key":"imagetest"}`))
	if err != nil {
		t.Fatalf("POST /v1/check: %v", err)
	}
	defer resp.Body.Close()
	var d struct {
		Allowed   bool  `json:"allowed"`
		Limit     int64 `json:"limit"`
		Remaining int64 `json:"remaining"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&d); err != nil || resp.StatusCode != 200 || !d.Allowed || d.Limit != 100 || d.Remaining != 99 {
		t.Errorf("POST /v1/check on rule api: %d %+v (%v), want allowed, limit 100, remaining 99", resp.StatusCode, d, err)
	}
}

// checkProcess checks, through /proc, that the server runs as 65532 on a
// read-only root.
func (c *container) checkProcess(t *testing.T) {
	t.Helper()
	pid := c.pid(t)
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(status), "\n") {
		if f := strings.Fields(line); len(f) == 5 && (f[0] == "Uid:" || f[0] == "Gid:") {
			for _, id := range f[1:] {
				if id != "65532" {
					t.Errorf("the server's %s %v, want 65532 throughout", f[0], f[1:])
					break
				}
			}
		}
	}
	mounts, err := os.ReadFile(fmt.Sprintf("/proc/%d/mounts", pid))
	if err != nil {
		t.Fatal(err)
	}
	rootRO := false
	for _, line := range strings.Split(string(mounts), "\n") {
		if f := strings.Fields(line); len(f) >= 4 && f[1] == "/" {
			rootRO = strings.HasPrefix(f[3], "ro,") || f[3] == "ro"
		}
	}
	if !rootRO {
		t.Errorf("the container's root is not read-only:\n%s", mounts)
	}
}

// pid returns the container's process id on the host.
func (c *container) pid(t *testing.T) int {
	t.Helper()
	var st struct {
		Pid    int    `json:"pid"`
		Status string `json:"status"`
	}
	if err := json.Unmarshal(cmd(t, "runc", "state", c.id), &st); err != nil || st.Pid == 0 {
		t.Fatalf("runc state %s: %+v %v", c.id, st, err)
	}
	return st.Pid
}

// checkStops sends SIGTERM as Kubernetes does and checks that the
// container exits, with status 0, within stopWithin.
func (c *container) checkStops(t *testing.T) {
	t.Helper()
	start := time.Now()
	cmd(t, "runc", "kill", c.id, "TERM")
	select {
	case err := <-c.done:
		c.done <- err
		took := time.Since(start)
		t.Logf("exited %v after SIGTERM", took.Round(time.Millisecond))
		if err != nil {
			t.Errorf("exit after SIGTERM: %v, want status 0", err)
		}
		if took > stopWithin {
			t.Errorf("took %v to exit after SIGTERM, want at most %v", took, stopWithin)
		}
	case <-time.After(stopWithin):
		t.Errorf("still running %v after SIGTERM", stopWithin)
	}
}

// waitRule waits, up to 10s, for the server to serve a rule named name.
func (c *container) waitRule(t *testing.T, name string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		_, body, err := get(c.http, "/v1/rules")
		if err == nil && strings.Contains(body, `"name":"`+name+`"`) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("rule %q not served 10s after the rules directory changed: %s (%v)\nstderr:\n%s", name, body, err, c.stderr.String())
		}
		time.Sleep(50 * time.Millisecond) // polling a real process, not a unit test's clock
	}
}

// configMapDir is a rules directory laid out as the kubelet lays out a
// ConfigMap volume: rules.yaml is a symlink through ..data to a
// timestamped directory, and an update swaps ..data by a rename.
type configMapDir struct {
	dir string
	n   int
}

// newConfigMapDir returns a directory holding rules.yaml with content.
func newConfigMapDir(t *testing.T, content string) *configMapDir {
	t.Helper()
	d := &configMapDir{dir: t.TempDir()}
	// The server runs as 65532: the directory must be readable by all.
	if err := os.Chmod(d.dir, 0o755); err != nil {
		t.Fatal(err)
	}
	d.update(t, content)
	if err := os.Symlink("..data/rules.yaml", filepath.Join(d.dir, "rules.yaml")); err != nil {
		t.Fatal(err)
	}
	return d
}

// update writes content in a new version directory and swaps ..data to it.
func (d *configMapDir) update(t *testing.T, content string) {
	t.Helper()
	d.n++
	version := fmt.Sprintf("..v%d", d.n)
	if err := os.Mkdir(filepath.Join(d.dir, version), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(d.dir, version, "rules.yaml"), []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	tmp := filepath.Join(d.dir, "..data_tmp")
	if err := os.Symlink(version, tmp); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, filepath.Join(d.dir, "..data")); err != nil {
		t.Fatal(err)
	}
}

// imageRules returns the image's own rules file.
func imageRules(t *testing.T, rootfs string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(rootfs, "etc/floodgate/rules.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// userIDs reads a numeric "uid:gid" image user.
func userIDs(t *testing.T, user string) (uid, gid int) {
	t.Helper()
	u, g, ok := strings.Cut(user, ":")
	uid, err1 := strconv.Atoi(u)
	gid, err2 := strconv.Atoi(g)
	if !ok || err1 != nil || err2 != nil {
		t.Fatalf("image user %q is not numeric uid:gid", user)
	}
	return uid, gid
}

// mergeEnv returns base with over's variables set, over's winning.
func mergeEnv(base, over []string) []string {
	out := append([]string{}, base...)
	for _, kv := range over {
		name, _, _ := strings.Cut(kv, "=")
		replaced := false
		for i, b := range out {
			if strings.HasPrefix(b, name+"=") {
				out[i], replaced = kv, true
			}
		}
		if !replaced {
			out = append(out, kv)
		}
	}
	return out
}

// get returns the status and body of GET http://addr+path.
func get(addr, path string) (int, string, error) {
	client := &http.Client{Timeout: 2 * time.Second}
	resp, err := client.Get("http://" + addr + path)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	return resp.StatusCode, string(body), err
}

// cmd runs name with args and returns its standard output, failing t with
// its standard error.
func cmd(t *testing.T, name string, args ...string) []byte {
	t.Helper()
	var stderr bytes.Buffer
	c := exec.Command(name, args...)
	c.Stderr = &stderr
	out, err := c.Output()
	if err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) || stderr.Len() > 0 {
			t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, stderr.String())
		}
		t.Fatalf("%s %s: %v", name, strings.Join(args, " "), err)
	}
	return out
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}
