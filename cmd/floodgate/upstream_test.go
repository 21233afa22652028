package main

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/floodgate/floodgate"
	"github.com/floodgate/floodgate/internal/server/config"
	"github.com/floodgate/floodgate/internal/server/envoy"
	"github.com/floodgate/floodgate/internal/server/service"
	"github.com/floodgate/floodgate/internal/testkit/envoytest"
	"github.com/floodgate/floodgate/internal/testkit/nettest"
	"github.com/floodgate/floodgate/internal/testkit/peertest"
	"github.com/floodgate/floodgate/internal/testkit/redistest"
	"github.com/floodgate/floodgate/internal/testkit/syncbuf"
	"github.com/floodgate/floodgate/internal/testkit/tlstest"
)

func envOf(kv ...string) func(string) (string, bool) {
	m := map[string]string{}
	for i := 0; i+1 < len(kv); i += 2 {
		m[kv[i]] = kv[i+1]
	}
	return func(k string) (string, bool) { v, ok := m[k]; return v, ok }
}

// flagValue returns the value of --name in args, and whether it is
// there.
func flagValue(args []string, name string) (string, bool) {
	for _, a := range args {
		if v, ok := strings.CutPrefix(a, "--"+name+"="); ok {
			return v, true
		}
	}
	return "", false
}

// TestUpstreamSettings maps envoyproxy/ratelimit's environments, from its
// defaults to its own integration tests' and Envoy Gateway's, onto
// serve's flags.
func TestUpstreamSettings(t *testing.T) {
	for _, tc := range []struct {
		name  string
		env   []string
		flags map[string]string // flag: value; "-" for absent
		check func(t *testing.T, u *upstream)
		notes []string // substrings of the notes, in any order
	}{
		{name: "defaults", flags: map[string]string{
			"http": "0.0.0.0:8080", "grpc": "0.0.0.0:8081", "resp": "", "log-level": "warn", "log-format": "text",
			"config": "/srv/runtime_data/current/config", "redis": "unix:///var/run/nutcracker/ratelimit.sock?dial_timeout=10s&pool_size=10",
			"denial-cache": "-", "redis-prefix": "-", "rls-headers": "false", "stop-cache-key-increment-when-overlimit": "false", "merge-domain-config": "false"},
			check: func(t *testing.T, u *upstream) {
				if u.admin != "0.0.0.0:6070" || u.statsd == nil || u.statsd.Network != "tcp" || u.statsd.Addr != "localhost:8125" || u.statsd.FlushInterval != 10*time.Second || u.xds != nil || u.prometheus != "" {
					t.Errorf("admin %q, statsd %+v, xds %v, prometheus %q", u.admin, u.statsd, u.xds, u.prometheus)
				}
				if u.envoy.NearLimitRatio != 0.8 || u.envoy.GlobalShadowMode || u.envoy.HeaderNames != [3]string{} {
					t.Errorf("envoy options %+v", u.envoy)
				}
			}},
		{name: "upstream's integration tests", env: []string{
			"RUNTIME_ROOT", "runtime/current", "RUNTIME_SUBDIRECTORY", "ratelimit", "RUNTIME_APPDIRECTORY", "config",
			"REDIS_PERSECOND_SOCKET_TYPE", "tcp", "REDIS_SOCKET_TYPE", "tcp", "DEBUG_PORT", "8084", "USE_STATSD", "false", "PORT", "8082", "GRPC_PORT", "8083",
			"REDIS_PERSECOND", "true", "LOCAL_CACHE_SIZE_IN_BYTES", "1000", "BACKEND_TYPE", "redis", "REDIS_URL", "localhost:6383", "REDIS_PERSECOND_URL", "localhost:6380",
			"CACHE_KEY_PREFIX", "prefix:", "STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT", "true"},
			flags: map[string]string{"http": "0.0.0.0:8082", "grpc": "0.0.0.0:8083", "config": "runtime/current/ratelimit/config",
				"redis": "redis://localhost:6383/0?dial_timeout=10s&pool_size=10", "denial-cache": "true", "redis-prefix": "prefix:floodgate:", "stop-cache-key-increment-when-overlimit": "true"},
			check: func(t *testing.T, u *upstream) {
				if u.admin != "0.0.0.0:8084" || u.statsd != nil {
					t.Errorf("admin %q, statsd %+v", u.admin, u.statsd)
				}
			},
			notes: []string{"$LOCAL_CACHE_SIZE_IN_BYTES", "$REDIS_PERSECOND"}},
		{name: "Envoy Gateway's", env: []string{
			"REDIS_SOCKET_TYPE", "tcp", "REDIS_URL", "redis.redis.svc:6379", "RUNTIME_ROOT", "/data", "RUNTIME_SUBDIRECTORY", "ratelimit",
			"RUNTIME_IGNOREDOTFILES", "true", "RUNTIME_WATCH_ROOT", "false", "LOG_LEVEL", "info", "USE_STATSD", "true", "STATSD_PORT", "9125",
			"GRPC_SERVER_USE_TLS", "true", "GRPC_SERVER_TLS_CERT", "/certs/tls.crt", "GRPC_SERVER_TLS_KEY", "/certs/tls.key", "GRPC_SERVER_TLS_CA_CERT", "/certs/ca.crt"},
			flags: map[string]string{"config": "/data/ratelimit/config", "redis": "redis://redis.redis.svc:6379/0?dial_timeout=10s&pool_size=10", "log-level": "info"},
			check: func(t *testing.T, u *upstream) {
				if u.statsd == nil || u.statsd.Addr != "localhost:9125" || u.statsd.Network != "tcp" {
					t.Errorf("statsd %+v", u.statsd)
				}
				if u.grpcTLS.Cert != "/certs/tls.crt" || u.grpcTLS.Key != "/certs/tls.key" || u.grpcTLS.ClientCA != "" {
					t.Errorf("gRPC TLS %+v", u.grpcTLS)
				}
			}},
		{name: "Envoy Gateway's xDS", env: []string{"CONFIG_TYPE", "GRPC_XDS_SOTW", "CONFIG_GRPC_XDS_SERVER_URL", "envoy-gateway:18001", "CONFIG_GRPC_XDS_NODE_ID", "envoy-ratelimit",
			"CONFIG_GRPC_XDS_SERVER_USE_TLS", "true", "CONFIG_GRPC_XDS_CLIENT_TLS_CERT", "/certs/tls.crt", "CONFIG_GRPC_XDS_CLIENT_TLS_KEY", "/certs/tls.key",
			"CONFIG_GRPC_XDS_SERVER_TLS_CACERT", "/certs/ca.crt", "FORCE_START_WITHOUT_INITIAL_CONFIG", "true", "CONFIG_GRPC_XDS_NODE_METADATA", "zone:eu,tier:1"},
			flags: map[string]string{"config": "-"},
			check: func(t *testing.T, u *upstream) {
				x := u.xds
				if x == nil || x.ServerURL != "envoy-gateway:18001" || x.NodeID != "envoy-ratelimit" || !x.UseTLS || x.ClientCert != "/certs/tls.crt" || x.ServerCA != "/certs/ca.crt" ||
					!x.ForceStart || x.NodeMetadata["zone"] != "eu" || x.BackoffInitial != 10*time.Second || x.BackoffMax != time.Minute || !x.BackoffJitter || x.ConnectRetryInterval != 3*time.Second {
					t.Errorf("xds %+v", x)
				}
			}},
		{name: "sentinel", env: []string{"REDIS_SOCKET_TYPE", "tcp", "REDIS_TYPE", "SENTINEL", "REDIS_URL", "mymaster,s1:26379,s2:26379", "REDIS_AUTH", "app:p@ss", "REDIS_SENTINEL_AUTH", "sentpass", "REDIS_POOL_SIZE", "4"},
			flags: map[string]string{"redis": "redis+sentinel://:sentpass@s1:26379/0?addr=s2%3A26379&dial_timeout=10s&master_name=mymaster&password=p%40ss&pool_size=4&username=app"}},
		{name: "cluster over TLS", env: []string{"REDIS_SOCKET_TYPE", "tcp", "REDIS_TYPE", "cluster", "REDIS_URL", "n1:7000,n2:7000,n3:7000", "REDIS_AUTH", "secret", "REDIS_TLS", "true", "REDIS_TLS_CACERT", "/ca.pem", "REDIS_TIMEOUT", "2s"},
			flags: map[string]string{"redis": "rediss+cluster://:secret@n1:7000?addr=n2%3A7000&addr=n3%3A7000&dial_timeout=2s&pool_size=10", "redis-tls-ca": "/ca.pem"}},
		{name: "statsd udp with tags", env: []string{"STATSD_PROTOCOL", "udp", "STATSD_HOST", "statsd", "EXTRA_TAGS", "env:prod,app:rl", "STATS_FLUSH_INTERVAL", "1s"},
			check: func(t *testing.T, u *upstream) {
				if u.statsd == nil || u.statsd.Network != "udp" || u.statsd.Addr != "statsd:8125" || u.statsd.Tags["env"] != "prod" || u.statsd.FlushInterval != time.Second || u.statsd.DogStatsD {
					t.Errorf("statsd %+v", u.statsd)
				}
			}},
		{name: "dogstatsd with mogrifiers", env: []string{"USE_STATSD", "false", "USE_DOG_STATSD", "true", "USE_DOG_STATSD_MOGRIFIERS", "HITS",
			"DOG_STATSD_MOGRIFIER_HITS_PATTERN", `^ratelimit\.service\.rate_limit\.([^.]+)\.(.*)\.([^.]+)$`, "DOG_STATSD_MOGRIFIER_HITS_NAME", "ratelimit.service.rate_limit.$3",
			"DOG_STATSD_MOGRIFIER_HITS_TAGS", "domain:$1,descriptor:$2"},
			check: func(t *testing.T, u *upstream) {
				if u.statsd == nil || !u.statsd.DogStatsD || u.statsd.Network != "udp" || len(u.statsd.Mogrifiers) != 1 || u.statsd.Mogrifiers[0].Tags["descriptor"] != "$2" {
					t.Errorf("statsd %+v", u.statsd)
				}
			}},
		{name: "prometheus", env: []string{"USE_STATSD", "false", "USE_PROMETHEUS", "true", "PROMETHEUS_ADDR", ":19001", "PROMETHEUS_MAPPER_YAML", "/m.yaml"},
			check: func(t *testing.T, u *upstream) {
				if u.statsd != nil || u.prometheus != ":19001" || u.prometheusPath != "/metrics" {
					t.Errorf("statsd %+v, prometheus %q %q", u.statsd, u.prometheus, u.prometheusPath)
				}
			}, notes: []string{"$PROMETHEUS_MAPPER_YAML"}},
		{name: "envoy options", env: []string{"SHADOW_MODE", "true", "QUOTA_MODE", "true", "NEAR_LIMIT_RATIO", "0.5", "LIMIT_RESPONSE_HEADERS_ENABLED", "true",
			"LIMIT_REMAINING_HEADER", "X-Left", "MERGE_DOMAIN_CONFIG", "true", "LOG_LEVEL", "TRACE", "LOG_FORMAT", "json", "DISABLE_STATS", "true"},
			flags: map[string]string{"rls-headers": "true", "merge-domain-config": "true", "log-level": "debug", "log-format": "json"},
			check: func(t *testing.T, u *upstream) {
				if !u.envoy.GlobalShadowMode || !u.envoy.GlobalQuotaMode || u.envoy.NearLimitRatio != 0.5 || u.envoy.HeaderNames != [3]string{"", "X-Left", ""} || u.statsd != nil {
					t.Errorf("envoy options %+v, statsd %+v", u.envoy, u.statsd)
				}
			}},
		{name: "floodgate's own variables", env: []string{"FLOODGATE_RESP", "127.0.0.1:6380", "FLOODGATE_REDIS", ""},
			flags: map[string]string{"resp": "-", "redis": ""}, notes: []string{"$FLOODGATE_REDIS"}},
		{name: "notes", env: []string{"RUNTIME_IGNOREDOTFILES", "false", "GRPC_MAX_CONNECTION_AGE", "1h", "REDIS_PIPELINE_WINDOW", "150us", "MEMCACHE_HOST_PORT", "m:11211",
			"EXPIRATION_JITTER_MAX_SECONDS", "60", "HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED", "true", "RESPONSE_DYNAMIC_METADATA", "true", "TRACING_ENABLED", "true",
			"CONFIG_GRPC_XDS_SERVER_URL", "x:1", "GRPC_SERVER_TLS_CERT", "/c", "REDIS_HEALTH_CHECK_ACTIVE_CONNECTION", "true"},
			notes: []string{"$RUNTIME_IGNOREDOTFILES", "$GRPC_MAX_CONNECTION_AGE", "$REDIS_PIPELINE_WINDOW", "$MEMCACHE_HOST_PORT", "$EXPIRATION_JITTER_MAX_SECONDS",
				"$HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED", "$RESPONSE_DYNAMIC_METADATA", "$TRACING_ENABLED", "$CONFIG_GRPC_XDS_SERVER_URL", "$GRPC_SERVER_TLS_CERT", "$REDIS_HEALTH_CHECK_ACTIVE_CONNECTION"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			u, err := upstreamSettings(envOf(tc.env...))
			if err != nil {
				t.Fatal(err)
			}
			for name, want := range tc.flags {
				got, ok := flagValue(u.args, name)
				switch {
				case want == "-" && ok:
					t.Errorf("--%s=%s, want it absent", name, got)
				case want != "-" && (!ok || got != want):
					t.Errorf("--%s=%q (set %v), want %q", name, got, ok, want)
				}
			}
			if tc.check != nil {
				tc.check(t, u)
			}
			for _, n := range tc.notes {
				if !slices.ContainsFunc(u.notes, func(s string) bool { return strings.Contains(s, n) }) {
					t.Errorf("no note on %s in %q", n, u.notes)
				}
			}
			// The flags parse as serve's, and the Redis URL as the store's.
			if _, code, ok := parseServeFlags(u.args, io.Discard); !ok {
				t.Errorf("serve refuses the flags %q (status %d)", u.args, code)
			}
			if r, ok := flagValue(u.args, "redis"); ok && r != "" {
				var f storeFlags
				f.redis = r
				c, _, err := f.redisClient(nil)
				if err != nil {
					t.Errorf("the store refuses %s: %v", r, err)
				} else {
					c.Close()
				}
			}
		})
	}
}

// TestUpstreamSettingsRefused: a value floodgate cannot honour, or that is
// malformed, stops the start with an error that names the variable.
func TestUpstreamSettingsRefused(t *testing.T) {
	for _, tc := range []struct {
		env  []string
		want string
	}{
		{[]string{"PORT", "http"}, "$PORT"},
		{[]string{"GRPC_PORT", "70000"}, "$GRPC_PORT"},
		{[]string{"GRPC_UDS", "/tmp/rl.sock"}, "$GRPC_UDS"},
		{[]string{"GRPC_SERVER_USE_TLS", "true"}, "$GRPC_SERVER_TLS_CERT"},
		{[]string{"GRPC_SERVER_USE_TLS", "true", "GRPC_SERVER_TLS_CERT", "c", "GRPC_SERVER_TLS_KEY", "k", "GRPC_CLIENT_TLS_SAN", "client"}, "$GRPC_CLIENT_TLS_SAN"},
		{[]string{"LOG_LEVEL", "loud"}, "$LOG_LEVEL"},
		{[]string{"CONFIG_TYPE", "GRPC_XDS_DELTA"}, "$CONFIG_TYPE"},
		{[]string{"CONFIG_TYPE", "GRPC_XDS_SOTW", "XDS_CLIENT_BACKOFF_MAX_INTERVAL", "soon"}, "$XDS_CLIENT_BACKOFF_MAX_INTERVAL"},
		{[]string{"BACKEND_TYPE", "memcache"}, "$BACKEND_TYPE"},
		{[]string{"BACKEND_TYPE", "etcd"}, "$BACKEND_TYPE"},
		{[]string{"REDIS_SOCKET_TYPE", "udp"}, "$REDIS_SOCKET_TYPE"},
		{[]string{"REDIS_SOCKET_TYPE", "tcp", "REDIS_TYPE", "ring"}, "$REDIS_TYPE"},
		{[]string{"REDIS_SOCKET_TYPE", "tcp", "REDIS_URL", "no-port"}, "$REDIS_URL"},
		{[]string{"REDIS_SOCKET_TYPE", "tcp", "REDIS_TYPE", "sentinel", "REDIS_URL", "onlymaster"}, "$REDIS_URL"},
		{[]string{"REDIS_TYPE", "cluster", "REDIS_URL", "a:1"}, "$REDIS_TYPE"},
		{[]string{"REDIS_TLS", "true"}, "$REDIS_TLS"},
		{[]string{"REDIS_SOCKET_TYPE", "tcp", "REDIS_URL", "r:6379", "REDIS_TLS", "true", "REDIS_TLS_SKIP_HOSTNAME_VERIFICATION", "true"}, "$REDIS_TLS_SKIP_HOSTNAME_VERIFICATION"},
		{[]string{"REDIS_SOCKET_TYPE", "tcp", "REDIS_URL", "r:6379", "REDIS_POOL_ON_EMPTY_BEHAVIOR", "ERROR"}, "$REDIS_POOL_ON_EMPTY_BEHAVIOR"},
		{[]string{"REDIS_POOL_SIZE", "0"}, "$REDIS_POOL_SIZE"},
		{[]string{"REDIS_TIMEOUT", "ten"}, "$REDIS_TIMEOUT"},
		{[]string{"NEAR_LIMIT_RATIO", "1.5"}, "$NEAR_LIMIT_RATIO"},
		{[]string{"NEAR_LIMIT_RATIO", "most"}, "$NEAR_LIMIT_RATIO"},
		{[]string{"SHADOW_MODE", "yes"}, "$SHADOW_MODE"},
		{[]string{"USE_STATSD", "true", "USE_PROMETHEUS", "true"}, "$USE_PROMETHEUS"},
		{[]string{"STATSD_PROTOCOL", "sctp"}, "$STATSD_PROTOCOL"},
		{[]string{"STATS_FLUSH_INTERVAL", "0s"}, "$STATS_FLUSH_INTERVAL"},
		{[]string{"EXTRA_TAGS", "novalue"}, "$EXTRA_TAGS"},
		{[]string{"USE_STATSD", "false", "USE_DOG_STATSD", "true", "USE_DOG_STATSD_MOGRIFIERS", "X"}, "DOG_STATSD_MOGRIFIER_X_PATTERN"},
		{[]string{"USE_STATSD", "false", "USE_DOG_STATSD", "true", "USE_DOG_STATSD_MOGRIFIERS", "X", "DOG_STATSD_MOGRIFIER_X_PATTERN", "(", "DOG_STATSD_MOGRIFIER_X_NAME", "n"}, "$DOG_STATSD_MOGRIFIER_X_PATTERN"},
		{[]string{"USE_PROMETHEUS", "true", "USE_STATSD", "false", "PROMETHEUS_PATH", "metrics"}, "$PROMETHEUS_PATH"},
	} {
		_, err := upstreamSettings(envOf(tc.env...))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: error %v, want one naming %s", tc.env, err, tc.want)
		}
	}
	// Several at once are all named.
	_, err := upstreamSettings(envOf("PORT", "x", "LOG_LEVEL", "y", "BACKEND_TYPE", "memcache"))
	for _, want := range []string{"$PORT", "$LOG_LEVEL", "$BACKEND_TYPE"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("error %v does not name %s", err, want)
		}
	}
	// A header name Envoy could not send.
	u, err := upstreamSettings(envOf("LIMIT_LIMIT_HEADER", "Rate Limit"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := newEnvoyForTest(u); err == nil {
		t.Error("a header name with a space was accepted")
	}
}

// TestUpstreamVariables checks the table of docs/envoy.md against
// envoyproxy/ratelimit's settings.go at the pinned version: every
// variable it reads is in upstreamVars, and upstreamSettings reads every
// one that upstreamVars says it uses.
func TestUpstreamVariables(t *testing.T) {
	src := settingsSource(t)
	names := map[string]bool{}
	for _, m := range regexp.MustCompile(`envconfig:"([A-Z0-9_]+)"`).FindAllStringSubmatch(src, -1) {
		names[m[1]] = true
	}
	if len(names) < 50 {
		t.Fatalf("found %d variables in settings.go: the pattern no longer fits it", len(names))
	}
	listed := map[string]bool{}
	for _, v := range upstreamVars {
		if listed[v.name] {
			t.Errorf("%s is listed twice", v.name)
		}
		listed[v.name] = true
		if !names[v.name] && v.name != "STATSD_PROTOCOL" {
			t.Errorf("%s is listed, but settings.go does not read it", v.name)
		}
	}
	for n := range names {
		if !listed[n] {
			t.Errorf("settings.go reads %s, which upstreamVars (and docs/envoy.md) does not list", n)
		}
	}
	// Every variable said to be used is read under some environment.
	read := map[string]bool{}
	for _, env := range [][]string{
		nil,
		{"CONFIG_TYPE", "GRPC_XDS_SOTW", "GRPC_SERVER_USE_TLS", "true", "GRPC_SERVER_TLS_CERT", "c", "GRPC_SERVER_TLS_KEY", "k", "REDIS_SOCKET_TYPE", "tcp", "REDIS_TYPE", "sentinel",
			"REDIS_URL", "m,a:1", "REDIS_TLS", "true", "REDIS_PERSECOND", "true", "USE_STATSD", "false", "USE_PROMETHEUS", "true", "LOCAL_CACHE_SIZE_IN_BYTES", "1"},
		{"USE_STATSD", "false", "USE_DOG_STATSD", "true", "BACKEND_TYPE", "memcache", "DISABLE_STATS", "false", "TRACING_ENABLED", "true"},
		{"DISABLE_STATS", "true"},
	} {
		look := envOf(env...)
		upstreamSettings(func(k string) (string, bool) { read[k] = true; return look(k) })
	}
	for _, v := range upstreamVars {
		if !read[v.name] && !strings.HasPrefix(v.does, "not used") {
			t.Errorf("%s: %q, but upstreamSettings never reads it", v.name, v.does)
		}
	}
	// docs/envoy.md lists the table whole, once the docs have it.
	doc, err := os.ReadFile("../../docs/envoy.md")
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(doc), "| `REDIS_URL` |") {
		for _, row := range strings.Split(upstreamTable(), "\n") {
			if row != "" && !strings.Contains(string(doc), row) {
				t.Errorf("docs/envoy.md lacks the row\n%s", row)
			}
		}
	}
}

// upstreamTable is the markdown table of upstreamVars, as docs/envoy.md
// has it.
func upstreamTable() string {
	var b strings.Builder
	b.WriteString("| Variable | Default | floodgate |\n|---|---|---|\n")
	for _, v := range upstreamVars {
		def := "`" + v.def + "`"
		if v.def == "" {
			def = ""
		}
		b.WriteString("| `" + v.name + "` | " + def + " | " + v.does + " |\n")
	}
	return b.String()
}

// TestPrintUpstreamTable prints the table for docs/envoy.md with
// FLOODGATE_PRINT_TABLE=1.
func TestPrintUpstreamTable(t *testing.T) {
	if os.Getenv("FLOODGATE_PRINT_TABLE") != "1" {
		t.Skip("set FLOODGATE_PRINT_TABLE=1 to print the table of docs/envoy.md")
	}
	os.Stdout.WriteString(upstreamTable())
}

// settingsSource returns envoyproxy/ratelimit's src/settings/settings.go
// at the version the peer tests build, from the module cache (the peer's
// build puts it there).
func settingsSource(t *testing.T) string {
	t.Helper()
	v, err := peertest.Version()
	if err != nil {
		t.Fatal(err)
	}
	path := func() string {
		if src := os.Getenv(peertest.SourceEnv); src != "" {
			return filepath.Join(src, "src/settings/settings.go")
		}
		out, err := exec.Command("go", "env", "GOMODCACHE").Output()
		if err != nil {
			t.Fatal(err)
		}
		return filepath.Join(strings.TrimSpace(string(out)), "github.com/envoyproxy/ratelimit@"+v, "src/settings/settings.go")
	}
	b, err := os.ReadFile(path())
	if err != nil {
		peertest.Build(t) // downloads the module, or skips (fails in CI)
		if b, err = os.ReadFile(path()); err != nil {
			t.Skipf("envoyproxy/ratelimit %s's settings.go is not in the module cache: %v", v, err)
		}
	}
	return string(b)
}

// ratelimitInstance is the floodgate binary started as ratelimit.
type ratelimitInstance struct {
	http, grpc, debug string
	stdout, stderr    *syncbuf.Buffer
	cmd               *exec.Cmd
}

// startRatelimit starts the test's floodgate binary under the name
// ratelimit, with no flags and env (plus PATH and HOME) as its whole
// environment, on loopback ports of its own (HOST, PORT, ... are set),
// and waits for /healthcheck.
func startRatelimit(t *testing.T, dir string, env ...string) *ratelimitInstance {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "ratelimit")
	if err := os.Link(binary, bin); err != nil {
		t.Fatalf("linking the binary as ratelimit: %v", err)
	}
	in := &ratelimitInstance{
		http:   "127.0.0.1:" + strconv.Itoa(redistest.FreePort(t)),
		grpc:   "127.0.0.1:" + strconv.Itoa(redistest.FreePort(t)),
		debug:  "127.0.0.1:" + strconv.Itoa(redistest.FreePort(t)),
		stdout: &syncbuf.Buffer{}, stderr: &syncbuf.Buffer{},
	}
	port := func(a string) string { _, p, _ := net.SplitHostPort(a); return p }
	in.cmd = exec.Command(bin)
	in.cmd.Dir = dir
	in.cmd.Env = append([]string{"PATH=" + os.Getenv("PATH"), "HOME=" + os.Getenv("HOME"), "GORACE=atexit_sleep_ms=0",
		"HOST=127.0.0.1", "GRPC_HOST=127.0.0.1", "DEBUG_HOST=127.0.0.1",
		"PORT=" + port(in.http), "GRPC_PORT=" + port(in.grpc), "DEBUG_PORT=" + port(in.debug)}, env...)
	in.cmd.Stdout, in.cmd.Stderr = in.stdout, in.stderr
	if err := in.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { in.cmd.Wait(); close(done) }()
	t.Cleanup(func() {
		in.cmd.Process.Kill()
		<-done
		if t.Failed() {
			t.Logf("ratelimit's stdout:\n%s\nstderr:\n%s", in.stdout, in.stderr)
		}
	})
	deadline := time.Now().Add(30 * time.Second)
	for {
		if code, body := httpGet(t, in.http, "/healthcheck"); code == 200 && body == "OK" {
			return in
		}
		select {
		case <-done:
			t.Fatalf("ratelimit exited before serving:\nstdout:\n%s\nstderr:\n%s", in.stdout, in.stderr)
		case <-time.After(50 * time.Millisecond): // polling a real process
		}
		if time.Now().After(deadline) {
			t.Fatalf("/healthcheck did not answer within 30s:\n%s", in.stderr)
		}
	}
}

// httpGet returns GET http://addr+path's status and body; 0 when it
// fails.
func httpGet(t *testing.T, addr, path string) (int, string) {
	t.Helper()
	c := &http.Client{Timeout: 2 * time.Second}
	resp, err := c.Get("http://" + addr + path)
	if err != nil {
		return 0, ""
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// TestRatelimitMode starts the binary as ratelimit with envoyproxy/ratelimit's
// own integration-test environment and runtime layout, and checks that it
// serves what that one serves where it serves it: the domains of
// runtime/current/ratelimit/config (not the files beside config/),
// /healthcheck and /json on PORT, RLS on GRPC_PORT, /rlconfig on
// DEBUG_PORT; that it counts in REDIS_URL's Redis under CACHE_KEY_PREFIX;
// and that it sends its statistics over TCP to STATSD_HOST:STATSD_PORT.
func TestRatelimitMode(t *testing.T) {
	srv := redistest.Start(t)
	dir := t.TempDir()
	for _, d := range []string{"runtime/current/ratelimit/config/nested"} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	writeFile(t, filepath.Join(dir, "runtime/current/ratelimit/config/basic.yaml"), "domain: basic\ndescriptors:\n  - key: key1\n    rate_limit:\n      unit: minute\n      requests_per_unit: 2\n")
	writeFile(t, filepath.Join(dir, "runtime/current/ratelimit/config/nested/another.yaml"), "domain: another\ndescriptors:\n  - key: key2\n    rate_limit:\n      unit: minute\n      requests_per_unit: 20\n")
	// Beside config/: not a domain, as there (upstream's reload.yaml).
	writeFile(t, filepath.Join(dir, "runtime/current/ratelimit/reload.yaml"), "this is not a domain: [")
	statsdPort, lines := nettest.TCPLines(t, 100)
	in := startRatelimit(t, dir,
		"RUNTIME_ROOT=runtime/current", "RUNTIME_SUBDIRECTORY=ratelimit", "RUNTIME_APPDIRECTORY=config", "RUNTIME_WATCH_ROOT=false",
		"REDIS_SOCKET_TYPE=tcp", "REDIS_URL="+srv.Addr, "BACKEND_TYPE=redis", "CACHE_KEY_PREFIX=prefix:", "LOG_LEVEL=debug",
		"USE_STATSD=true", "STATSD_HOST=127.0.0.1", "STATSD_PORT="+statsdPort, "STATS_FLUSH_INTERVAL=100ms", "EXTRA_TAGS=env:test")

	rl := peertest.Client(t, in.grpc)
	for i, want := range []rlsv3.RateLimitResponse_Code{rlsv3.RateLimitResponse_OK, rlsv3.RateLimitResponse_OK, rlsv3.RateLimitResponse_OVER_LIMIT} {
		resp, err := rl.ShouldRateLimit(context.Background(), envoytest.Request("basic", envoytest.Descriptor("key1", "foo")))
		if err != nil || resp.OverallCode != want {
			t.Fatalf("request %d: %v (%v), want %v", i, resp, err, want)
		}
	}
	resp, err := http.Post("http://"+in.http+"/json", "application/json", strings.NewReader(`{"domain":"another","descriptors":[{"entries":[{"key":"key2","value":"x"}]}]}`))
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || !strings.Contains(string(body), `"limitRemaining":19`) {
		t.Errorf("POST /json: %d %s", resp.StatusCode, body)
	}
	if code, body := httpGet(t, in.debug, "/rlconfig"); code != 200 || !strings.Contains(body, "basic.key1: 2 per 1m0s") || !strings.Contains(body, "domain another") {
		t.Errorf("GET /rlconfig on DEBUG_PORT: %d %q", code, body)
	}
	if code, body := httpGet(t, in.debug, "/"); code != 200 || !strings.Contains(body, "/rlconfig:") {
		t.Errorf("GET / on DEBUG_PORT: %d %q", code, body)
	}
	keys, err := srv.Admin(t).Keys(context.Background(), "*").Result()
	if err != nil || len(keys) == 0 || !slices.ContainsFunc(keys, func(k string) bool { return strings.HasPrefix(k, "prefix:floodgate:") }) {
		t.Errorf("Redis keys %q (%v), want keys under prefix:floodgate:", keys, err)
	}
	// The RESP listener is floodgate's, not envoyproxy/ratelimit's: off.
	if strings.Contains(in.stdout.String(), "Redis protocol on") {
		t.Errorf("the Redis protocol is served:\n%s", in.stdout)
	}
	// StatsD over TCP, as gostats sends: upstream's names, EXTRA_TAGS in
	// them as gostats writes tags.
	readStatsD(t, func() (string, error) {
		select {
		case l := <-lines:
			return l, nil
		case <-time.After(10 * time.Second):
			return "", errors.New("no StatsD line for 10s")
		}
	}, map[string]uint64{
		"ratelimit.service.rate_limit.basic.key1.total_hits.__env=test|c":   3,
		"ratelimit.service.rate_limit.basic.key1.over_limit.__env=test|c":   1,
		"ratelimit.service.rate_limit.basic.key1.within_limit.__env=test|c": 2,
		"ratelimit.service.rate_limit.basic.key1.near_limit.__env=test|c":   1,
		"ratelimit.service.rate_limit.another.key2.total_hits.__env=test|c": 1,
		"ratelimit_server.ShouldRateLimit.total_requests.__env=test|c":      3,
		"ratelimit.service.config_load_success.__env=test|c":                1,
	})
}

// TestRatelimitModeRefuses: a value floodgate cannot honour stops the
// start, with the variable named; flags are refused.
func TestRatelimitModeRefuses(t *testing.T) {
	bin := filepath.Join(t.TempDir(), "ratelimit")
	if err := os.Link(binary, bin); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		args, env []string
		want      string
	}{
		{env: []string{"BACKEND_TYPE=memcache"}, want: "$BACKEND_TYPE=memcache"},
		{env: []string{"REDIS_SOCKET_TYPE=tcp", "REDIS_URL=127.0.0.1:1", "REDIS_POOL_ON_EMPTY_BEHAVIOR=CREATE"}, want: "$REDIS_POOL_ON_EMPTY_BEHAVIOR=CREATE"},
		{env: []string{"CONFIG_TYPE=GRPC_XDS_SOTW", "CONFIG_GRPC_XDS_SERVER_USE_TLS=maybe", "USE_STATSD=false", "FLOODGATE_REDIS=", "PORT=0", "GRPC_PORT=0", "DEBUG_PORT=0", "HOST=127.0.0.1", "GRPC_HOST=127.0.0.1", "DEBUG_HOST=127.0.0.1"}, want: "$CONFIG_GRPC_XDS_SERVER_USE_TLS"},
		{env: []string{"CONFIG_TYPE=GRPC_XDS_DELTA"}, want: "$CONFIG_TYPE"},
		{args: []string{"--config", "x"}, want: "takes no flags"},
	} {
		// A start that is not refused would serve: bounded, it fails.
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		cmd := exec.CommandContext(ctx, bin, tc.args...)
		cmd.Env = append([]string{"PATH=" + os.Getenv("PATH")}, tc.env...)
		out, err := cmd.CombinedOutput()
		cancel()
		if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 2 || !strings.Contains(string(out), tc.want) {
			t.Errorf("%q %q: %v\n%s\nwant status 2 and %q", tc.args, tc.env, err, out, tc.want)
		}
	}
}

// TestServeStatsD: floodgate serve --statsd sends envoyproxy/ratelimit's
// statistics over UDP to a listener the test starts, DogStatsD's way with
// --statsd-dogstatsd.
func TestServeStatsD(t *testing.T) {
	l, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	dir := t.TempDir()
	writeFile(t, filepath.Join(dir, "edge.yaml"), "domain: edge\ndescriptors:\n  - key: remote_address\n    rate_limit:\n      unit: minute\n      requests_per_unit: 1\n")
	in := serve(t, "--config", dir, "--grpc", "127.0.0.1:0", "--statsd", l.LocalAddr().String(), "--statsd-dogstatsd", "--statsd-tags", "app:edge", "--statsd-flush", "50ms")
	rl := peertest.Client(t, in.grpcAddr)
	for range 2 {
		if _, err := rl.ShouldRateLimit(context.Background(), envoytest.Request("edge", envoytest.Descriptor("remote_address", "192.0.2.7"))); err != nil {
			t.Fatal(err)
		}
	}
	// Counts of a name add up over flushes.
	want := map[string]uint64{
		"ratelimit.service.rate_limit.edge.remote_address.total_hits|c|#app:edge": 2,
		"ratelimit.service.rate_limit.edge.remote_address.over_limit|c|#app:edge": 1,
		"ratelimit_server.ShouldRateLimit.total_requests|c|#app:edge":             2,
	}
	readStatsD(t, func() (string, error) {
		l.SetReadDeadline(time.Now().Add(10 * time.Second))
		buf := make([]byte, 65536)
		n, err := l.Read(buf)
		return string(buf[:n]), err
	}, want)
	if m := in.metrics(t); !strings.Contains(m, "floodgate_statsd_dropped_total 0") || !strings.Contains(m, "floodgate_statsd_packets_total") {
		t.Errorf("/metrics lacks the StatsD counters:\n%s", m)
	}
	// A bad --statsd stops serve.
	cmd := exec.Command(binary, "serve", "--http", "127.0.0.1:0", "--resp", "", "--statsd", "nohostport")
	if out, err := cmd.CombinedOutput(); err == nil || !strings.Contains(string(out), "statsd") {
		t.Errorf("--statsd nohostport: %v\n%s", err, out)
	}
}

// newEnvoyForTest makes the Envoy service with u's options, on a memory
// store.
func newEnvoyForTest(u *upstream) (*envoy.Service, error) {
	st := floodgate.NewMemoryStore(nil)
	defer st.Close()
	o := u.envoy
	return envoy.New(st, config.Example(), &service.Options{}, &o)
}

// readStatsD reads StatsD lines with read until the counters of want
// (name|kind|tags, the value left out) sum to at least their values, and
// fails t when one goes past it or read fails first. It returns the
// sums.
func readStatsD(t *testing.T, read func() (string, error), want map[string]uint64) map[string]uint64 {
	t.Helper()
	sums := map[string]uint64{}
	var got []string
	done := func() bool {
		for k, v := range want {
			if sums[k] < v {
				return false
			}
		}
		return true
	}
	for !done() {
		chunk, err := read()
		if err != nil {
			t.Fatalf("StatsD lines %q; want the sums %v: %v", got, want, err)
		}
		for _, line := range strings.Split(strings.TrimSpace(chunk), "\n") {
			got = append(got, line)
			name, rest, ok := strings.Cut(line, ":")
			if !ok {
				t.Fatalf("StatsD line %q is not name:value|kind", line)
			}
			value, kind, _ := strings.Cut(rest, "|")
			n, err := strconv.ParseUint(value, 10, 64)
			if err != nil {
				continue // a timer's milliseconds
			}
			sums[name+"|"+kind] += n
		}
	}
	for k, v := range want {
		if sums[k] != v {
			t.Errorf("StatsD %s summed to %d, want %d (lines %q)", k, sums[k], v, got)
		}
	}
	return sums
}

// TestRatelimitModeGRPCTLS: GRPC_SERVER_USE_TLS, as Envoy Gateway sets it,
// puts TLS on the gRPC listener alone, with client certificates from
// GRPC_CLIENT_TLS_CACERT; the HTTP port stays plain for the probes.
func TestRatelimitModeGRPCTLS(t *testing.T) {
	dir := t.TempDir()
	f := tlstest.NewCA(t).Write(t, dir, 9)
	if err := os.MkdirAll(filepath.Join(dir, "ratelimit/config"), 0o755); err != nil {
		t.Fatal(err)
	}
	writeFile(t, filepath.Join(dir, "ratelimit/config/d.yaml"), "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: minute, requests_per_unit: 5}\n")
	in := startRatelimit(t, dir, "RUNTIME_ROOT=.", "RUNTIME_SUBDIRECTORY=ratelimit", "USE_STATSD=false", "FLOODGATE_REDIS=",
		"GRPC_SERVER_USE_TLS=true", "GRPC_SERVER_TLS_CERT="+f.Cert, "GRPC_SERVER_TLS_KEY="+f.Key, "GRPC_CLIENT_TLS_CACERT="+f.CA)
	call := func(creds credentials.TransportCredentials) error {
		conn, err := grpc.NewClient(in.grpc, grpc.WithTransportCredentials(creds))
		if err != nil {
			return err
		}
		defer conn.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_, err = rlsv3.NewRateLimitServiceClient(conn).ShouldRateLimit(ctx, envoytest.Request("d", envoytest.Descriptor("k", "v")))
		return err
	}
	if err := call(credentials.NewTLS(tlstest.ClientConfig(t, f, true))); err != nil {
		t.Errorf("gRPC over TLS with a client certificate: %v", err)
	}
	if err := call(credentials.NewTLS(tlstest.ClientConfig(t, f, false))); err == nil {
		t.Error("gRPC without a client certificate got an answer")
	}
	if err := call(insecure.NewCredentials()); err == nil {
		t.Error("plain gRPC got an answer")
	}
	if code, body := httpGet(t, in.http, "/healthcheck"); code != 200 || body != "OK" {
		t.Errorf("plain GET /healthcheck: %d %q", code, body)
	}
}
