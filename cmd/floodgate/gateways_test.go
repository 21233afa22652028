package main

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/floodgate/floodgate/internal/testkit/redistest"
	"github.com/floodgate/floodgate/internal/testkit/syncbuf"
)

// The gateway tests put real nginx and Caddy, configured by the files in
// examples/nginx and examples/caddy, between a client and an
// application, asking floodgate serve's /v1/auth about every request.
// The clients connect from their own loopback addresses (127.0.0.2, ...)
// and the proxies from 127.0.0.1, the only address floodgate trusts.

// needGateway returns the path of a proxy's binary. Without it the test
// is skipped, or fails in CI, where scripts/test installs it.
func needGateway(t *testing.T, bin string) string {
	t.Helper()
	p, err := exec.LookPath(bin)
	if err != nil {
		if os.Getenv("CI") == "true" || os.Getenv("FLOODGATE_REQUIRE_GATEWAYS") == "1" {
			t.Fatalf("%s not found: install it (Debian: apt-get install %s); scripts/test does", bin, bin)
		}
		t.Skipf("%s not found; skipping (scripts/test installs it)", bin)
	}
	return p
}

// fillTemplate reads an example file and replaces its addresses, each of
// which must be there: an example that changed them must change the test.
func fillTemplate(t *testing.T, rel string, addrs map[string]string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(examplesDir, rel))
	if err != nil {
		t.Fatal(err)
	}
	s := string(b)
	for from, to := range addrs {
		if !strings.Contains(s, from) {
			t.Fatalf("examples/%s does not mention %s any more", rel, from)
		}
		s = strings.ReplaceAll(s, from, to)
	}
	return s
}

// freeAddr is a free loopback address.
func freeAddr(t *testing.T) string {
	return "127.0.0.1:" + strconv.Itoa(redistest.FreePort(t))
}

// startProxy starts cmd as a server on addr, its own process group, and
// stops it (SIGTERM to it, which stops its workers, then SIGKILL to its
// group) when t ends.
func startProxy(t *testing.T, cmd *exec.Cmd, addr string) {
	t.Helper()
	out := &syncbuf.Buffer{}
	cmd.Stdout, cmd.Stderr = out, out
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		cmd.Wait()
		close(done)
	}()
	t.Cleanup(func() {
		cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-done:
		case <-time.After(5 * time.Second):
			syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
			<-done
		}
	})
	for deadline := time.Now().Add(15 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		select {
		case <-done:
			t.Fatalf("%s exited:\n%s", cmd.Path, out)
		default:
		}
		if c, err := net.Dial("tcp", addr); err == nil {
			c.Close()
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s did not listen on %s:\n%s", cmd.Path, addr, out)
		}
	}
}

// startNginx runs examples/nginx/nginx.conf on a free port in front of
// floodgate and app, and returns its address.
func startNginx(t *testing.T, floodgate, app string) string {
	t.Helper()
	bin := needGateway(t, "nginx")
	dir := t.TempDir()
	addr := freeAddr(t)
	conf := fillTemplate(t, "nginx/nginx.conf", map[string]string{"127.0.0.1:8080": floodgate, "127.0.0.1:9000": app, "127.0.0.1:8000": addr})
	writeFile(t, filepath.Join(dir, "nginx.conf"), conf)
	// Its pid file and logs in dir, never the system's.
	startProxy(t, exec.Command(bin, "-p", dir, "-c", filepath.Join(dir, "nginx.conf"), "-e", "stderr",
		"-g", "daemon off; pid "+filepath.Join(dir, "nginx.pid")+";"), addr)
	return addr
}

// startCaddy runs examples/caddy/Caddyfile on free ports in front of
// floodgate and app, and returns the addresses of its fail-closed and
// fail-open sites.
func startCaddy(t *testing.T, floodgate, app string) (closed, open string) {
	t.Helper()
	bin := needGateway(t, "caddy")
	dir := t.TempDir()
	closed, open = freeAddr(t), freeAddr(t)
	conf := fillTemplate(t, "caddy/Caddyfile", map[string]string{"127.0.0.1:8080": floodgate, "127.0.0.1:9000": app, "127.0.0.1:8001": closed, "127.0.0.1:8002": open})
	// No admin endpoint: it would take localhost:2019, which another
	// Caddy may hold.
	writeFile(t, filepath.Join(dir, "Caddyfile"), "{\n\tadmin off\n}\n"+conf)
	cmd := exec.Command(bin, "run", "--config", filepath.Join(dir, "Caddyfile"), "--adapter", "caddyfile")
	cmd.Env = append(os.Environ(), "HOME="+dir, "XDG_DATA_HOME="+dir, "XDG_CONFIG_HOME="+dir)
	startProxy(t, cmd, closed)
	return closed, open
}

// startApp is the application behind the proxies: 200 "app".
func startApp(t *testing.T) string {
	t.Helper()
	app := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, "app")
	}))
	t.Cleanup(app.Close)
	return strings.TrimPrefix(app.URL, "http://")
}

// clientFrom is an HTTP client whose connections come from the loopback
// address ip.
func clientFrom(t *testing.T, ip string) *http.Client {
	d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(ip)}, Timeout: 5 * time.Second}
	tr := &http.Transport{DialContext: d.DialContext}
	t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: tr, Timeout: 10 * time.Second}
}

type gwAnswer struct {
	status int
	header http.Header
	body   string
}

func gwGet(t *testing.T, c *http.Client, url string, hdr ...string) gwAnswer {
	t.Helper()
	req, _ := http.NewRequest("GET", url, nil)
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Add(hdr[i], hdr[i+1])
	}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return gwAnswer{resp.StatusCode, resp.Header, string(b)}
}

// gatewayRules is rule "example" of the examples, 5 requests with no
// refill while a test runs.
const gatewayRules = `rules:
  - name: example
    algorithm: token-bucket
    rate: 1
    period: 1h
    burst: 5
`

const gatewayPolicy = `"example";q=5;w=18000`

func TestGateways(t *testing.T) {
	needGateway(t, "nginx")
	needGateway(t, "caddy")
	rules := filepath.Join(t.TempDir(), "rules.yaml")
	writeFile(t, rules, gatewayRules)
	rs := redistest.Start(t)
	fg := serve(t, "--config", rules, "--redis", "redis://"+rs.Addr, "--trusted-proxies", "127.0.0.1")
	fgAddr := strings.TrimPrefix(fg.httpURL, "http://")
	app := startApp(t)
	ngx := "http://" + startNginx(t, fgAddr, app)
	closed, open := startCaddy(t, fgAddr, app)
	caddy, caddyOpen := "http://"+closed, "http://"+open

	// A burst of 5 passes with its headers, the next request gets 429
	// with Retry-After, through each proxy.
	for i, proxy := range []string{ngx, caddy} {
		c := clientFrom(t, fmt.Sprintf("127.0.0.%d", 2+i))
		for n := range 5 {
			a := gwGet(t, c, proxy+"/")
			if a.status != 200 || a.body != "app" {
				t.Fatalf("%s request %d: %d %q", proxy, n, a.status, a.body)
			}
			if got, want := a.header.Get("RateLimit"), fmt.Sprintf(`"example";r=%d;t=`, 4-n); !strings.HasPrefix(got, want) {
				t.Errorf("%s request %d: RateLimit %q, want %s...", proxy, n, got, want)
			}
			if got := a.header.Get("RateLimit-Policy"); got != gatewayPolicy {
				t.Errorf("%s request %d: RateLimit-Policy %q", proxy, n, got)
			}
		}
		a := gwGet(t, c, proxy+"/")
		if a.status != 429 {
			t.Fatalf("%s: the 6th request got %d %q, want 429", proxy, a.status, a.body)
		}
		ra, err := strconv.Atoi(a.header.Get("Retry-After"))
		if err != nil || ra < 3500 || ra > 3600 {
			t.Errorf("%s: Retry-After %q, want the seconds until a token (3600)", proxy, a.header.Get("Retry-After"))
		}
		if got, want := a.header.Get("RateLimit"), fmt.Sprintf(`"example";r=0;t=%d`, ra); got != want {
			t.Errorf("%s: RateLimit %q, want %q", proxy, got, want)
		}
		if got := a.header.Get("RateLimit-Policy"); got != gatewayPolicy {
			t.Errorf("%s: RateLimit-Policy %q", proxy, got)
		}
	}

	// One client's limit is shared by both proxies: floodgate keys it by
	// its address, whichever proxy asks.
	c := clientFrom(t, "127.0.0.4")
	for n, proxy := range []string{ngx, caddy, ngx, caddy, ngx} {
		if a := gwGet(t, c, proxy+"/"); a.status != 200 {
			t.Fatalf("shared, request %d through %s: %d", n, proxy, a.status)
		}
	}
	for _, proxy := range []string{ngx, caddy, ngx + "/open", caddyOpen} {
		if a := gwGet(t, c, proxy+"/"); a.status != 429 || a.header.Get("Retry-After") == "" {
			t.Errorf("shared: the 6th request through %s/ got %d, Retry-After %q, want 429", proxy, a.status, a.header.Get("Retry-After"))
		}
	}

	// Forged headers change nothing: a fresh client claiming to be one
	// that is out of tokens keeps its own key, and one out of tokens
	// cannot ask for a cost of 0 or another rule.
	fresh := clientFrom(t, "127.0.0.5")
	spent := clientFrom(t, "127.0.0.4")
	for _, proxy := range []string{ngx, caddy} {
		a := gwGet(t, fresh, proxy+"/", "X-Forwarded-For", "127.0.0.4", "X-Real-IP", "127.0.0.4", "Forwarded", "for=127.0.0.4")
		if a.status != 200 || !strings.HasPrefix(a.header.Get("RateLimit"), `"example";r=`) {
			t.Errorf("%s: a client forging another's address got %d %q", proxy, a.status, a.header.Get("RateLimit"))
		}
		for _, forged := range [][]string{
			{"X-Floodgate-Cost", "0"},
			{"X-Floodgate-Rule", "other"},
			{"X-Forwarded-For", "127.0.0.9"},
			{"X-Real-IP", "127.0.0.9"},
		} {
			if a := gwGet(t, spent, proxy+"/", forged...); a.status != 429 {
				t.Errorf("%s: a spent client forging %s got %d", proxy, forged, a.status)
			}
		}
	}
	if strings.Contains(fg.stderr.String(), "level=ERROR") {
		t.Errorf("floodgate logged errors:\n%s", fg.stderr)
	}

	// floodgate down: nginx's default and Caddy's fail closed, the
	// examples' fail-open locations serve the request.
	fg.cmd.Process.Kill()
	<-fg.done
	c = clientFrom(t, "127.0.0.6")
	for _, tc := range []struct {
		url    string
		status int
	}{
		{ngx + "/", 500},
		{ngx + "/open/", 200},
		{caddy + "/", 502},
		{caddyOpen + "/", 200},
	} {
		if a := gwGet(t, c, tc.url); a.status != tc.status || tc.status == 200 && a.body != "app" {
			t.Errorf("floodgate down: %s answered %d %q, want %d", tc.url, a.status, a.body, tc.status)
		}
	}

	// A floodgate that refuses the requests as bad input (here: {ip}
	// without --trusted-proxies) is no way around the limit, not even
	// where the examples fail open.
	serve(t, "--config", rules, "--redis", "redis://"+rs.Addr, "--http", fgAddr)
	for _, tc := range []struct {
		url    string
		status int
	}{
		{ngx + "/", 500},
		{ngx + "/open/", 500},
		{caddy + "/", 400},
		{caddyOpen + "/", 400},
	} {
		if a := gwGet(t, c, tc.url); a.status != tc.status {
			t.Errorf("floodgate refusing: %s answered %d %q, want %d", tc.url, a.status, a.body, tc.status)
		}
	}
}

// TestGatewayLatency measures what asking floodgate adds to a request
// through nginx: the example's limited location against its /free/ one,
// interleaved, from one client over keep-alive. It asserts nothing about
// time. By default it makes 200 requests of each against the race-built
// floodgate; FLOODGATE_LATENCY=1 makes 2,000 against a plain build.
func TestGatewayLatency(t *testing.T) {
	needGateway(t, "nginx")
	n, bin := 200, binary
	if os.Getenv("FLOODGATE_LATENCY") == "1" {
		n, bin = 2000, filepath.Join(t.TempDir(), "floodgate")
		if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
			t.Fatalf("building floodgate: %v\n%s", err, out)
		}
	}
	rules := filepath.Join(t.TempDir(), "rules.yaml")
	writeFile(t, rules, "rules:\n  - name: example\n    algorithm: token-bucket\n    rate: 1000000\n    period: 1s\n    burst: 1000000\n")
	args := []string{"--config", rules, "--trusted-proxies", "127.0.0.1"}
	if rs := os.Getenv("FLOODGATE_LATENCY_REDIS"); rs == "1" {
		args = append(args, "--redis", "redis://"+redistest.Start(t).Addr)
	}
	fg := serveBinary(t, bin, args...)
	ngx := "http://" + startNginx(t, strings.TrimPrefix(fg.httpURL, "http://"), startApp(t))
	c := clientFrom(t, "127.0.0.2")
	var with, without []time.Duration
	time1 := func(url string) time.Duration {
		start := time.Now()
		a := gwGet(t, c, url)
		d := time.Since(start)
		if a.status != 200 {
			t.Fatalf("%s: %d %q", url, a.status, a.body)
		}
		return d
	}
	for range 50 { // warm up connections and caches
		time1(ngx + "/")
		time1(ngx + "/free/")
	}
	for range n {
		with = append(with, time1(ngx+"/"))
		without = append(without, time1(ngx+"/free/"))
	}
	pct := func(ds []time.Duration, p int) time.Duration {
		s := slices.Clone(ds)
		slices.Sort(s)
		return s[(len(s)-1)*p/100]
	}
	t.Logf("%d requests each through nginx (%s floodgate, %s store): with auth p50 %v p99 %v; without p50 %v p99 %v; added p50 %v p99 %v",
		n, map[bool]string{true: "plain", false: "race-built"}[bin != binary], map[bool]string{true: "Redis", false: "memory"}[len(args) > 4],
		pct(with, 50), pct(with, 99), pct(without, 50), pct(without, 99), pct(with, 50)-pct(without, 50), pct(with, 99)-pct(without, 99))
}

// TestBadProxyFlags: a --trusted-proxies or --client-ip-header that
// cannot be read stops serve at start, naming the flag.
func TestBadProxyFlags(t *testing.T) {
	for _, tt := range []struct{ args, want []string }{
		{[]string{"--trusted-proxies", "10.0.0.0/33"}, []string{"--trusted-proxies: ", `"10.0.0.0/33"`}},
		{[]string{"--trusted-proxies", "127.0.0.1,nginx"}, []string{"--trusted-proxies: ", `"nginx"`}},
		{[]string{"--client-ip-header", "X-Client-IP"}, []string{"--client-ip-header: ", "X-Real-IP"}},
	} {
		out, err := exec.Command(binary, append([]string{"serve", "--http", "127.0.0.1:0", "--resp", ""}, tt.args...)...).CombinedOutput()
		if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 2 {
			t.Fatalf("%q: exit %v\n%s", tt.args, err, out)
		}
		for _, w := range tt.want {
			if !strings.Contains(string(out), w) {
				t.Errorf("%q: output lacks %q:\n%s", tt.args, w, out)
			}
		}
	}
}
