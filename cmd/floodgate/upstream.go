package main

// envoyproxy/ratelimit's deployment contract: the floodgate binary,
// started under the name "ratelimit" (the image's /bin/ratelimit, as
// Envoy Gateway's, Istio's and most charts' manifests start
// envoyproxy/ratelimit), takes no flags and reads its whole configuration
// from envoyproxy/ratelimit's environment (its src/settings/settings.go),
// mapped here onto floodgate serve's flags. Each variable is honoured, or
// accepted with a note logged at start where it does not apply, or, when
// its value asks for what floodgate cannot do, refused with an error that
// names it. docs/envoy.md has the table.

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/floodgate/floodgate/internal/server/envoy"
	"github.com/floodgate/floodgate/internal/server/statsd"
	"github.com/floodgate/floodgate/internal/server/tlsconf"
)

// ratelimitName is the name (argv[0]'s base) under which the binary is
// envoyproxy/ratelimit's drop-in.
const ratelimitName = "ratelimit"

const ratelimitUsage = `floodgate, started as ratelimit: envoyproxy/ratelimit's drop-in.

It takes no flags: its configuration is envoyproxy/ratelimit's environment
(RUNTIME_ROOT, REDIS_URL, PORT, GRPC_PORT, USE_STATSD, ...), as
docs/envoy.md lists it. Run "floodgate serve --help" for floodgate's own
flags; FLOODGATE_* variables for what envoyproxy/ratelimit has no
variable for (FLOODGATE_FALLBACK, FLOODGATE_DENIAL_CACHE, FLOODGATE_TOKEN,
...) apply here too.
`

// ratelimitCmd runs serve with the configuration upstreamSettings reads
// from the environment.
func ratelimitCmd(ctx context.Context, args []string, stdout, stderr io.Writer, redisLog func(*slog.Logger)) int {
	if len(args) > 0 {
		switch args[0] {
		case "-h", "--help", "-help", "help":
			fmt.Fprint(stdout, ratelimitUsage)
			return 0
		case "version", "--version", "-version":
			fmt.Fprintln(stdout, "floodgate", versionLine())
			return 0
		}
		fmt.Fprintf(stderr, "ratelimit: unexpected argument %q: started as ratelimit, floodgate reads envoyproxy/ratelimit's environment and takes no flags (see --help)\n", args[0])
		return 2
	}
	u, err := upstreamSettings(os.LookupEnv)
	if err != nil {
		fmt.Fprintf(stderr, "ratelimit: envoyproxy/ratelimit's environment: %v\n", err)
		return 2
	}
	f, code, ok := parseServeFlags(u.args, stderr)
	if !ok {
		return code
	}
	f.upstream = u
	// envoyproxy/ratelimit traces only with TRACING_ENABLED, which this
	// mode notes and does not apply: the OTEL_* variables that a
	// deployment of it sets must not turn serve's tracing on either.
	f.traceCfg.on = false
	return serveFlagsCmd(ctx, f, stdout, stderr, redisLog)
}

// upstream is what envoyproxy/ratelimit's environment asks of serve
// beyond its flags.
type upstream struct {
	// args are serve's flags that the environment gives.
	args []string
	// notes are logged at start: variables set that floodgate accepts
	// but does not apply, and how it does what they ask otherwise.
	notes []string
	// admin is DEBUG_HOST:DEBUG_PORT, envoyproxy/ratelimit's debug
	// listener: /rlconfig, /stats, /healthcheck.
	admin string
	// prometheus is PROMETHEUS_ADDR with USE_PROMETHEUS: /metrics
	// (PROMETHEUS_PATH) on a listener of its own; "" without.
	prometheus, prometheusPath string
	// grpcTLS is GRPC_SERVER_USE_TLS's certificates: TLS on the gRPC
	// listener only, as there (the HTTP port stays plain for the
	// probes).
	grpcTLS tlsconf.Files
	// envoy are the Envoy service's options the environment sets.
	envoy envoy.Options
	// statsd is the StatsD sink's options (USE_STATSD, USE_DOG_STATSD);
	// nil without.
	statsd *statsd.Options
	// xds is CONFIG_TYPE=GRPC_XDS_SOTW's settings; nil with FILE.
	xds *XDSSettings
}

// XDSSettings are envoyproxy/ratelimit's CONFIG_GRPC_XDS_* and XDS_CLIENT_*
// variables, read when CONFIG_TYPE is GRPC_XDS_SOTW: where the xDS
// configuration source subscribes to RateLimitConfig resources. serve
// hands them to it as they are; their names say which variable each is.
type XDSSettings struct {
	ServerURL            string            // CONFIG_GRPC_XDS_SERVER_URL, default localhost:18000
	NodeID               string            // CONFIG_GRPC_XDS_NODE_ID, default "default"
	NodeMetadata         map[string]string // CONFIG_GRPC_XDS_NODE_METADATA, "k:v,k2:v2"
	ConnectRetryInterval time.Duration     // CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL, default 3s
	AdditionalHeaders    map[string]string // CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS, "k:v,k2:v2"
	UseTLS               bool              // CONFIG_GRPC_XDS_SERVER_USE_TLS
	ClientCert           string            // CONFIG_GRPC_XDS_CLIENT_TLS_CERT
	ClientKey            string            // CONFIG_GRPC_XDS_CLIENT_TLS_KEY
	ServerCA             string            // CONFIG_GRPC_XDS_SERVER_TLS_CACERT
	ServerSAN            string            // CONFIG_GRPC_XDS_SERVER_TLS_SAN
	BackoffInitial       time.Duration     // XDS_CLIENT_BACKOFF_INITIAL_INTERVAL, default 10s
	BackoffMax           time.Duration     // XDS_CLIENT_BACKOFF_MAX_INTERVAL, default 60s
	BackoffRandomFactor  float64           // XDS_CLIENT_BACKOFF_RANDOM_FACTOR, default 0.5
	BackoffJitter        bool              // XDS_CLIENT_BACKOFF_JITTER, default true
	MaxMsgSize           int               // XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES; 0: gRPC's default
	// ForceStart is FORCE_START_WITHOUT_INITIAL_CONFIG: serve before the
	// first configuration arrives (with no limits until it does).
	ForceStart bool
}

// upstreamEnv reads envoyproxy/ratelimit's variables with their defaults
// and keeps every malformed value as an error naming the variable.
type upstreamEnv struct {
	lookup func(string) (string, bool)
	errs   []error
	notes  []string
}

func (e *upstreamEnv) set(name string) bool {
	_, ok := e.lookup(name)
	return ok
}

// str returns $name, or def when it is unset or empty, as envconfig
// reads it.
func (e *upstreamEnv) str(name, def string) string {
	if v, ok := e.lookup(name); ok && v != "" {
		return v
	}
	return def
}

func (e *upstreamEnv) bad(name, v, what string) {
	e.errs = append(e.errs, fmt.Errorf("$%s: %q is not %s", name, v, what))
}

func (e *upstreamEnv) bool(name string, def bool) bool {
	v := e.str(name, "")
	if v == "" {
		return def
	}
	b, err := strconv.ParseBool(strings.TrimSpace(v))
	if err != nil {
		e.bad(name, v, "true or false")
		return def
	}
	return b
}

func (e *upstreamEnv) int(name string, def int) int {
	v := e.str(name, "")
	if v == "" {
		return def
	}
	n, err := strconv.Atoi(strings.TrimSpace(v))
	if err != nil {
		e.bad(name, v, "a whole number")
		return def
	}
	return n
}

func (e *upstreamEnv) port(name string, def int) int {
	p := e.int(name, def)
	if p < 0 || p > 65535 {
		e.bad(name, strconv.Itoa(p), "a port (0 to 65535)")
		return def
	}
	return p
}

func (e *upstreamEnv) duration(name string, def time.Duration) time.Duration {
	v := e.str(name, "")
	if v == "" {
		return def
	}
	d, err := time.ParseDuration(strings.TrimSpace(v))
	if err != nil {
		e.bad(name, v, "a duration (like 10s)")
		return def
	}
	return d
}

func (e *upstreamEnv) float(name string, def float64) float64 {
	v := e.str(name, "")
	if v == "" {
		return def
	}
	x, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
	if err != nil {
		e.bad(name, v, "a number")
		return def
	}
	return x
}

func (e *upstreamEnv) tags(name string) map[string]string {
	v := e.str(name, "")
	if v == "" {
		return nil
	}
	m, err := statsd.ParseTags(v)
	if err != nil {
		e.errs = append(e.errs, fmt.Errorf("$%s: %w", name, err))
	}
	return m
}

// note records that name, when set, is accepted but not applied, and why.
func (e *upstreamEnv) note(name, why string) {
	if e.set(name) {
		e.notes = append(e.notes, "$"+name+": "+why)
	}
}

// logLevels maps logrus's levels, which envoyproxy/ratelimit's LOG_LEVEL
// names, to serve's.
var logLevels = map[string]string{"panic": "error", "fatal": "error", "error": "error", "warn": "warn", "warning": "warn", "info": "info", "debug": "debug", "trace": "debug"}

// upstreamSettings maps envoyproxy/ratelimit's environment, read with
// lookup, to serve's flags and the rest of what serve does for it; an
// error names every variable whose value floodgate cannot take.
func upstreamSettings(lookup func(string) (string, bool)) (*upstream, error) {
	e := &upstreamEnv{lookup: lookup}
	u := &upstream{}
	flag := func(name, value string) { u.args = append(u.args, "--"+name+"="+value) }

	// Listeners.
	flag("http", net.JoinHostPort(e.str("HOST", "0.0.0.0"), strconv.Itoa(e.port("PORT", 8080))))
	if v := e.str("GRPC_UDS", ""); v != "" {
		e.errs = append(e.errs, fmt.Errorf("$GRPC_UDS=%s: floodgate serves gRPC on TCP only; unset it and set GRPC_HOST and GRPC_PORT", v))
	}
	flag("grpc", net.JoinHostPort(e.str("GRPC_HOST", "0.0.0.0"), strconv.Itoa(e.port("GRPC_PORT", 8081))))
	u.admin = net.JoinHostPort(e.str("DEBUG_HOST", "0.0.0.0"), strconv.Itoa(e.port("DEBUG_PORT", 6070)))
	if _, ok := lookup("FLOODGATE_RESP"); !ok {
		flag("resp", "") // envoyproxy/ratelimit has no Redis-protocol listener
	}
	e.note("GRPC_MAX_CONNECTION_AGE", "floodgate closes idle gRPC connections instead (--grpc-idle-timeout, $FLOODGATE_GRPC_IDLE_TIMEOUT)")
	e.note("GRPC_MAX_CONNECTION_AGE_GRACE", "floodgate closes idle gRPC connections instead (--grpc-idle-timeout, $FLOODGATE_GRPC_IDLE_TIMEOUT)")
	if e.bool("GRPC_SERVER_USE_TLS", false) {
		u.grpcTLS = tlsconf.Files{Cert: e.str("GRPC_SERVER_TLS_CERT", ""), Key: e.str("GRPC_SERVER_TLS_KEY", ""), ClientCA: e.str("GRPC_CLIENT_TLS_CACERT", "")}
		if u.grpcTLS.Cert == "" || u.grpcTLS.Key == "" {
			e.errs = append(e.errs, errors.New("$GRPC_SERVER_USE_TLS=true needs $GRPC_SERVER_TLS_CERT and $GRPC_SERVER_TLS_KEY"))
		}
		if v := e.str("GRPC_CLIENT_TLS_SAN", ""); v != "" {
			e.errs = append(e.errs, fmt.Errorf("$GRPC_CLIENT_TLS_SAN=%s: floodgate accepts any client certificate from $GRPC_CLIENT_TLS_CACERT and cannot require a SAN; unset it", v))
		}
	} else {
		for _, n := range []string{"GRPC_SERVER_TLS_CERT", "GRPC_SERVER_TLS_KEY", "GRPC_CLIENT_TLS_CACERT", "GRPC_CLIENT_TLS_SAN"} {
			e.note(n, "ignored without GRPC_SERVER_USE_TLS=true, as there")
		}
	}

	// Logs.
	level := strings.ToLower(strings.TrimSpace(e.str("LOG_LEVEL", "warn")))
	if l, ok := logLevels[level]; ok {
		flag("log-level", l)
	} else {
		e.bad("LOG_LEVEL", e.str("LOG_LEVEL", ""), "a log level (trace, debug, info, warn, error, fatal, panic)")
	}
	format := strings.ToLower(strings.TrimSpace(e.str("LOG_FORMAT", "text")))
	if format != "json" {
		format = "text" // there, anything but json is text
	}
	flag("log-format", format)

	// Configuration.
	switch ct := e.str("CONFIG_TYPE", "FILE"); ct {
	case "FILE":
		for _, n := range []string{"CONFIG_GRPC_XDS_SERVER_URL", "CONFIG_GRPC_XDS_NODE_ID", "FORCE_START_WITHOUT_INITIAL_CONFIG"} {
			e.note(n, "ignored with CONFIG_TYPE=FILE, as there")
		}
	case "GRPC_XDS_SOTW":
		u.xds = &XDSSettings{
			ServerURL:            e.str("CONFIG_GRPC_XDS_SERVER_URL", "localhost:18000"),
			NodeID:               e.str("CONFIG_GRPC_XDS_NODE_ID", "default"),
			NodeMetadata:         e.tags("CONFIG_GRPC_XDS_NODE_METADATA"),
			ConnectRetryInterval: e.duration("CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL", 3*time.Second),
			AdditionalHeaders:    e.tags("CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS"),
			UseTLS:               e.bool("CONFIG_GRPC_XDS_SERVER_USE_TLS", false),
			ClientCert:           e.str("CONFIG_GRPC_XDS_CLIENT_TLS_CERT", ""),
			ClientKey:            e.str("CONFIG_GRPC_XDS_CLIENT_TLS_KEY", ""),
			ServerCA:             e.str("CONFIG_GRPC_XDS_SERVER_TLS_CACERT", ""),
			ServerSAN:            e.str("CONFIG_GRPC_XDS_SERVER_TLS_SAN", ""),
			BackoffInitial:       e.duration("XDS_CLIENT_BACKOFF_INITIAL_INTERVAL", 10*time.Second),
			BackoffMax:           e.duration("XDS_CLIENT_BACKOFF_MAX_INTERVAL", 60*time.Second),
			BackoffRandomFactor:  e.float("XDS_CLIENT_BACKOFF_RANDOM_FACTOR", 0.5),
			BackoffJitter:        e.bool("XDS_CLIENT_BACKOFF_JITTER", true),
			MaxMsgSize:           e.int("XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES", 0),
			ForceStart:           e.bool("FORCE_START_WITHOUT_INITIAL_CONFIG", false),
		}
	default:
		e.bad("CONFIG_TYPE", ct, "FILE or GRPC_XDS_SOTW")
	}
	root, sub, app := e.str("RUNTIME_ROOT", "/srv/runtime_data/current"), e.str("RUNTIME_SUBDIRECTORY", ""), e.str("RUNTIME_APPDIRECTORY", "config")
	if u.xds == nil {
		// Either way it loads the files under root/sub/app: the whole of
		// root/sub/app, or what of root/sub is under app when it watches
		// the root. The watcher polls the path, and sees a swapped symlink
		// of the root as a change as well.
		flag("config", filepath.Join(root, sub, app))
	}
	e.bool("RUNTIME_WATCH_ROOT", true) // honoured: checked only
	if !e.bool("RUNTIME_IGNOREDOTFILES", false) {
		e.note("RUNTIME_IGNOREDOTFILES", "floodgate always skips dot files and dot directories (a ConfigMap's ..data is read through its symlinks)")
	}
	if e.bool("MERGE_DOMAIN_CONFIG", false) {
		flag("merge-domain-config", "true")
	} else {
		flag("merge-domain-config", "false")
	}
	e.note("HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED", "floodgate starts only with a valid configuration, and is healthy from then on")

	// The store.
	backend := strings.ToLower(e.str("BACKEND_TYPE", "redis"))
	switch backend {
	case "redis":
	case "memcache":
		e.errs = append(e.errs, errors.New("$BACKEND_TYPE=memcache: floodgate has no memcached store; use Redis (BACKEND_TYPE=redis, REDIS_URL)"))
	default:
		e.bad("BACKEND_TYPE", backend, "redis or memcache")
	}
	for _, n := range []string{"MEMCACHE_HOST_PORT", "MEMCACHE_MAX_IDLE_CONNS", "MEMCACHE_SRV", "MEMCACHE_SRV_REFRESH", "MEMCACHE_TLS", "MEMCACHE_TLS_CLIENT_CERT", "MEMCACHE_TLS_CLIENT_KEY", "MEMCACHE_TLS_CACERT", "MEMCACHE_TLS_SKIP_HOSTNAME_VERIFICATION"} {
		e.note(n, "floodgate has no memcached store")
	}
	if v, ok := lookup("FLOODGATE_REDIS"); ok {
		// floodgate's own variable wins: FLOODGATE_REDIS= (empty) runs
		// the embedded store, for one replica or a test.
		flag("redis", v)
		e.notes = append(e.notes, "$FLOODGATE_REDIS is set: it replaces REDIS_* as the store")
	} else if backend == "redis" {
		if redisURL, err := upstreamRedis(e, u); err != nil {
			e.errs = append(e.errs, err)
		} else {
			flag("redis", redisURL)
		}
	}
	if v := e.str("CACHE_KEY_PREFIX", ""); v != "" {
		// floodgate's keys, under the deployment's prefix: apart from
		// another deployment's, and from envoyproxy/ratelimit's own keys
		// in a Redis that both share while one replaces the other.
		flag("redis-prefix", v+"floodgate:")
	}
	if e.int("LOCAL_CACHE_SIZE_IN_BYTES", 0) > 0 {
		flag("denial-cache", "true")
		e.notes = append(e.notes, "$LOCAL_CACHE_SIZE_IN_BYTES: floodgate's denial cache replaces the local over-limit cache: it answers a request Redis denied a moment ago locally, exactly as Redis would, until its retry-after")
	}
	e.note("EXPIRATION_JITTER_MAX_SECONDS", "floodgate's keys expire when their limit is full again; no jitter is needed")
	if e.bool("STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT", false) {
		flag("stop-cache-key-increment-when-overlimit", "true")
	} else {
		flag("stop-cache-key-increment-when-overlimit", "false")
	}

	// Envoy's answers.
	if e.bool("LIMIT_RESPONSE_HEADERS_ENABLED", false) {
		flag("rls-headers", "true")
	} else {
		flag("rls-headers", "false")
	}
	u.envoy.HeaderNames = [3]string{e.str("LIMIT_LIMIT_HEADER", ""), e.str("LIMIT_REMAINING_HEADER", ""), e.str("LIMIT_RESET_HEADER", "")}
	u.envoy.GlobalShadowMode = e.bool("SHADOW_MODE", false)
	u.envoy.GlobalQuotaMode = e.bool("QUOTA_MODE", false)
	if r := e.float("NEAR_LIMIT_RATIO", 0.8); r > 0 && r <= 1 {
		u.envoy.NearLimitRatio = float32(r)
	} else {
		e.bad("NEAR_LIMIT_RATIO", e.str("NEAR_LIMIT_RATIO", ""), "a ratio above 0 and at most 1")
	}
	if e.bool("RESPONSE_DYNAMIC_METADATA", false) {
		e.notes = append(e.notes, "$RESPONSE_DYNAMIC_METADATA: floodgate sends no dynamic metadata; its answers are otherwise the same")
	}

	// Statistics.
	upstreamStats(e, u)
	if e.bool("TRACING_ENABLED", false) {
		e.notes = append(e.notes, "$TRACING_ENABLED: floodgate does not export traces in this mode; TRACING_* are ignored")
	}
	if err := errors.Join(e.errs...); err != nil {
		return nil, err
	}
	u.notes = e.notes
	return u, nil
}

// upstreamRedis returns the Redis URL (with --redis-tls-* flags added to
// u.args) that REDIS_* describe.
func upstreamRedis(e *upstreamEnv, u *upstream) (string, error) {
	socket := strings.ToLower(e.str("REDIS_SOCKET_TYPE", "unix"))
	typ := strings.ToLower(e.str("REDIS_TYPE", "SINGLE"))
	addr := e.str("REDIS_URL", "/var/run/nutcracker/ratelimit.sock")
	useTLS := e.bool("REDIS_TLS", false)
	if socket != "tcp" && socket != "unix" {
		return "", fmt.Errorf("$REDIS_SOCKET_TYPE: %q is not tcp or unix", socket)
	}
	q := url.Values{}
	if n := e.int("REDIS_POOL_SIZE", 10); n > 0 {
		q.Set("pool_size", strconv.Itoa(n))
	} else {
		e.bad("REDIS_POOL_SIZE", strconv.Itoa(n), "a pool size of 1 or more")
	}
	if d := e.duration("REDIS_TIMEOUT", 10*time.Second); d > 0 {
		q.Set("dial_timeout", d.String()) // decisions wait for Redis at most --budget
	}
	var user *url.Userinfo
	if auth := e.str("REDIS_AUTH", ""); auth != "" {
		if name, pass, ok := strings.Cut(auth, ":"); ok {
			user = url.UserPassword(name, pass)
		} else {
			user = url.UserPassword("", auth)
		}
	}
	if e.str("REDIS_TLS_CLIENT_CERT", "") != "" || e.str("REDIS_TLS_CACERT", "") != "" {
		if !useTLS && !e.bool("REDIS_PERSECOND_TLS", false) {
			e.note("REDIS_TLS_CLIENT_CERT", "ignored without REDIS_TLS=true, as there")
			e.note("REDIS_TLS_CACERT", "ignored without REDIS_TLS=true, as there")
		}
	}
	if useTLS {
		for flagName, v := range map[string]string{"redis-tls-cert": e.str("REDIS_TLS_CLIENT_CERT", ""), "redis-tls-key": e.str("REDIS_TLS_CLIENT_KEY", ""), "redis-tls-ca": e.str("REDIS_TLS_CACERT", "")} {
			if v != "" {
				u.args = append(u.args, "--"+flagName+"="+v)
			}
		}
		if e.bool("REDIS_TLS_SKIP_HOSTNAME_VERIFICATION", false) {
			return "", errors.New("$REDIS_TLS_SKIP_HOSTNAME_VERIFICATION=true: floodgate checks the name in Redis's certificate; set FLOODGATE_REDIS_TLS_SERVER_NAME to the name it holds instead (or, for a test, FLOODGATE_REDIS_TLS_INSECURE_SKIP_VERIFY=true)")
		}
	}
	switch behavior := strings.ToUpper(e.str("REDIS_POOL_ON_EMPTY_BEHAVIOR", "WAIT")); behavior {
	case "WAIT":
	default:
		return "", fmt.Errorf("$REDIS_POOL_ON_EMPTY_BEHAVIOR=%s: envoyproxy/ratelimit refuses it too; a decision waits for a connection at most --budget ($FLOODGATE_BUDGET), then the fallback answers: unset it or set WAIT", behavior)
	}
	e.note("REDIS_PIPELINE_WINDOW", "floodgate batches the decisions that wait for Redis on its own")
	e.note("REDIS_PIPELINE_LIMIT", "floodgate batches the decisions that wait for Redis on its own")
	e.note("REDIS_HEALTH_CHECK_ACTIVE_CONNECTION", "floodgate's /readyz reports Redis; /healthcheck stays OK while the fallback answers")
	if e.bool("REDIS_PERSECOND", false) {
		e.notes = append(e.notes, "$REDIS_PERSECOND: per-second limits are counted in REDIS_URL's Redis with the others; REDIS_PERSECOND_* are not used")
	}
	scheme := "redis"
	if useTLS {
		scheme = "rediss"
	}
	switch typ {
	case "single":
		if socket == "unix" {
			if useTLS {
				return "", errors.New("$REDIS_TLS=true with REDIS_SOCKET_TYPE=unix: floodgate speaks TLS to Redis over TCP only")
			}
			return (&url.URL{Scheme: "unix", User: user, Path: addr, RawQuery: q.Encode()}).String(), nil
		}
		if _, _, err := net.SplitHostPort(addr); err != nil {
			return "", fmt.Errorf("$REDIS_URL: %q is not host:port", addr)
		}
		return (&url.URL{Scheme: scheme, User: user, Host: addr, Path: "/0", RawQuery: q.Encode()}).String(), nil
	case "sentinel":
		parts := splitList(addr)
		if len(parts) < 2 {
			return "", fmt.Errorf("$REDIS_URL: %q is not a master name and the Sentinels' addresses, as <master>,<host:port>,... with REDIS_TYPE=sentinel", addr)
		}
		if socket != "tcp" {
			return "", errors.New("$REDIS_TYPE=sentinel needs REDIS_SOCKET_TYPE=tcp")
		}
		q.Set("master_name", parts[0])
		for _, a := range parts[2:] {
			q.Add("addr", a)
		}
		if user != nil { // the master's credentials
			if name := user.Username(); name != "" {
				q.Set("username", name)
			}
			p, _ := user.Password()
			q.Set("password", p)
		}
		var sentinelUser *url.Userinfo
		if auth := e.str("REDIS_SENTINEL_AUTH", ""); auth != "" {
			if name, pass, ok := strings.Cut(auth, ":"); ok {
				sentinelUser = url.UserPassword(name, pass)
			} else {
				sentinelUser = url.UserPassword("", auth)
			}
		}
		return (&url.URL{Scheme: scheme + "+sentinel", User: sentinelUser, Host: parts[1], Path: "/0", RawQuery: q.Encode()}).String(), nil
	case "cluster":
		parts := splitList(addr)
		if len(parts) == 0 {
			return "", fmt.Errorf("$REDIS_URL: %q names no Cluster node", addr)
		}
		if socket != "tcp" {
			return "", errors.New("$REDIS_TYPE=cluster needs REDIS_SOCKET_TYPE=tcp")
		}
		for _, a := range parts[1:] {
			q.Add("addr", a)
		}
		return (&url.URL{Scheme: scheme + "+cluster", User: user, Host: parts[0], RawQuery: q.Encode()}).String(), nil
	}
	return "", fmt.Errorf("$REDIS_TYPE: %q is not single, sentinel or cluster", typ)
}

// upstreamStats reads the statistics' variables: USE_STATSD (on by
// default there, over TCP as gostats sends), USE_DOG_STATSD,
// USE_PROMETHEUS and DISABLE_STATS, one sink at most as there.
func upstreamStats(e *upstreamEnv, u *upstream) {
	if e.bool("DISABLE_STATS", false) {
		return
	}
	useStatsd, useDog, useProm := e.bool("USE_STATSD", true), e.bool("USE_DOG_STATSD", false), e.bool("USE_PROMETHEUS", false)
	n := 0
	for _, b := range []bool{useStatsd, useDog, useProm} {
		if b {
			n++
		}
	}
	if n > 1 {
		e.errs = append(e.errs, errors.New("$USE_STATSD, $USE_DOG_STATSD and $USE_PROMETHEUS: set one at most, as envoyproxy/ratelimit requires (USE_STATSD is true unless set false)"))
		return
	}
	o := &statsd.Options{
		Addr:          net.JoinHostPort(e.str("STATSD_HOST", "localhost"), strconv.Itoa(e.port("STATSD_PORT", 8125))),
		FlushInterval: e.duration("STATS_FLUSH_INTERVAL", 10*time.Second),
		Tags:          e.tags("EXTRA_TAGS"),
	}
	if o.FlushInterval <= 0 {
		e.bad("STATS_FLUSH_INTERVAL", e.str("STATS_FLUSH_INTERVAL", ""), "a positive duration")
	}
	switch {
	case useStatsd:
		// gostats's sink: TCP unless STATSD_PROTOCOL says udp.
		o.Network = strings.ToLower(e.str("STATSD_PROTOCOL", "tcp"))
		if o.Network != "tcp" && o.Network != "udp" {
			e.bad("STATSD_PROTOCOL", o.Network, "tcp or udp")
		}
		u.statsd = o
	case useDog:
		o.Network, o.DogStatsD = "udp", true
		for _, name := range splitList(e.str("USE_DOG_STATSD_MOGRIFIERS", "")) {
			m, err := mogrifier(e, name)
			if err != nil {
				e.errs = append(e.errs, err)
				continue
			}
			o.Mogrifiers = append(o.Mogrifiers, m)
		}
		u.statsd = o
	case useProm:
		u.prometheus = e.str("PROMETHEUS_ADDR", ":9090")
		u.prometheusPath = e.str("PROMETHEUS_PATH", "/metrics")
		if !strings.HasPrefix(u.prometheusPath, "/") {
			e.bad("PROMETHEUS_PATH", u.prometheusPath, "a path starting with /")
		}
		e.note("PROMETHEUS_MAPPER_YAML", "floodgate's Prometheus names are those of envoyproxy/ratelimit's default mapping; a custom mapping is not applied")
	}
}

// mogrifier reads DOG_STATSD_MOGRIFIER_<name>_{PATTERN,NAME,TAGS}.
func mogrifier(e *upstreamEnv, name string) (statsd.Mogrifier, error) {
	pre := "DOG_STATSD_MOGRIFIER_" + name + "_"
	pattern, nm := e.str(pre+"PATTERN", ""), e.str(pre+"NAME", "")
	if pattern == "" || nm == "" {
		return statsd.Mogrifier{}, fmt.Errorf("$USE_DOG_STATSD_MOGRIFIERS names %s: $%sPATTERN and $%sNAME must be set", name, pre, pre)
	}
	re, err := regexp.Compile(pattern)
	if err != nil {
		return statsd.Mogrifier{}, fmt.Errorf("$%sPATTERN: %w", pre, err)
	}
	tags := e.tags(pre + "TAGS")
	for k, v := range tags {
		if v == "" {
			return statsd.Mogrifier{}, fmt.Errorf("$%sTAGS: tag %q has no value", pre, k)
		}
	}
	return statsd.Mogrifier{Pattern: re, Name: nm, Tags: tags}, nil
}
