package main

import (
	"context"
	"crypto/tls"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/signal"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/floodgate/floodgate/fallback"
	"github.com/floodgate/floodgate/httplimit"
	"github.com/floodgate/floodgate/internal/lib/clientip"
	"github.com/floodgate/floodgate/internal/lib/gcfloor"
	"github.com/floodgate/floodgate/internal/lib/lograte"
	"github.com/floodgate/floodgate/internal/server/config"
	"github.com/floodgate/floodgate/internal/server/dash"
	"github.com/floodgate/floodgate/internal/server/envoy"
	"github.com/floodgate/floodgate/internal/server/httpapi"
	"github.com/floodgate/floodgate/internal/server/metrics"
	"github.com/floodgate/floodgate/internal/server/resp"
	"github.com/floodgate/floodgate/internal/server/service"
	"github.com/floodgate/floodgate/internal/server/statsd"
	"github.com/floodgate/floodgate/internal/server/tlsconf"
	"github.com/floodgate/floodgate/internal/server/tracing"
	"github.com/floodgate/floodgate/internal/server/xds"
	"github.com/floodgate/floodgate/redisstore"
	"go.opentelemetry.io/otel/trace"
	"golang.org/x/net/netutil"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
)

// serveFlags are the flags of floodgate serve.
type serveFlags struct {
	store  storeFlags
	config string
	http   string
	resp   string
	grpc   string
	// Envoy's rate limit service: envoyproxy/ratelimit's options.
	stopIncrement, rlsHeaders, mergeDomains bool
	token                                   string
	watch                                   time.Duration
	// protectMetrics requires the token on /metrics too.
	protectMetrics bool
	// httpMaxConns caps the HTTP listener's open connections.
	httpMaxConns int64
	// grpcMaxConns caps the gRPC listener's open connections, and
	// grpcLimits bound each of them; grpcMsgSize is --grpc-max-msg-size
	// as written (bytes, KiB, MiB).
	grpcMaxConns int64
	grpcStreams  int64
	grpcMsgSize  string
	grpcLimits   envoy.Limits
	// tls names the certificate files of both listeners; empty: no TLS.
	tls tlsconf.Files
	// ui serves the dashboard at /ui/, sampling every uiStep.
	ui     bool
	uiStep time.Duration
	// trustedProxies (--trusted-proxies, comma-separated) and
	// clientIPHeader tell /v1/auth whose client address header to
	// believe.
	trustedProxies string
	clientIPHeader string
	trusted        []netip.Prefix
	// log is --log-format and --log-level.
	log logFlags
	// gcFloor is how far the heap grows between collections at least, as
	// --gc-floor reads: bytes, KiB, MiB, GiB; "0" for Go's default.
	gcFloor string
	// statsd is --statsd and its options.
	statsd statsdFlags
	// upstream is what envoyproxy/ratelimit's environment asks beyond
	// the flags, when started as ratelimit; nil for floodgate serve.
	upstream *upstream
	// trace is the tracing flags, and traceCfg what they and the OTEL_*
	// variables ask for (tracing.go).
	trace    traceFlags
	traceCfg *traceConfig
	// xds takes the Envoy domains from an xDS server (--xds-*).
	xds xdsFlags
}

// statsdFlags are --statsd, --statsd-tags, --statsd-dogstatsd and
// --statsd-flush: envoyproxy/ratelimit's statistics sent to StatsD.
type statsdFlags struct {
	addr  string // [udp://|tcp://]host:port; "" for none
	tags  string // key:value,...
	dog   bool
	flush time.Duration
}

func (s *statsdFlags) register(fs *flag.FlagSet, e *env) {
	fs.StringVar(&s.addr, "statsd", e.str("FLOODGATE_STATSD", ""), "send envoyproxy/ratelimit's statistics, under its names (ratelimit.service.rate_limit.<domain>.<descriptor>.total_hits, ...), to this StatsD server: host:port over UDP, or tcp://host:port; empty (the default) for none. A slow or absent server loses statistics, never slows a decision ($FLOODGATE_STATSD)")
	fs.StringVar(&s.tags, "statsd-tags", e.str("FLOODGATE_STATSD_TAGS", ""), "tags for every StatsD statistic, key:value,... (envoyproxy/ratelimit's EXTRA_TAGS): in the name as gostats writes them, or as DogStatsD tags with --statsd-dogstatsd ($FLOODGATE_STATSD_TAGS)")
	fs.BoolVar(&s.dog, "statsd-dogstatsd", e.bool("FLOODGATE_STATSD_DOGSTATSD", false), "send tags in DogStatsD's form, name:1|c|#key:value ($FLOODGATE_STATSD_DOGSTATSD)")
	fs.DurationVar(&s.flush, "statsd-flush", e.duration("FLOODGATE_STATSD_FLUSH", statsd.DefaultFlushInterval), "how often counters are sent to StatsD ($FLOODGATE_STATSD_FLUSH)")
}

// options returns the StatsD sink's options the flags ask for, nil for
// none.
func (s *statsdFlags) options() (*statsd.Options, error) {
	if s.addr == "" {
		return nil, nil
	}
	o := &statsd.Options{Addr: s.addr, Network: "udp", DogStatsD: s.dog, FlushInterval: s.flush}
	if rest, ok := strings.CutPrefix(s.addr, "tcp://"); ok {
		o.Addr, o.Network = rest, "tcp"
	} else if rest, ok := strings.CutPrefix(s.addr, "udp://"); ok {
		o.Addr = rest
	}
	if s.flush <= 0 {
		return nil, fmt.Errorf("--statsd-flush ($FLOODGATE_STATSD_FLUSH) must be positive, got %s", s.flush)
	}
	tags, err := statsd.ParseTags(s.tags)
	if err != nil {
		return nil, fmt.Errorf("--statsd-tags ($FLOODGATE_STATSD_TAGS): %w", err)
	}
	if len(tags) > 0 {
		o.Tags = tags
	}
	return o, nil
}

func parseServeFlags(args []string, stderr io.Writer) (*serveFlags, int, bool) {
	fs := flag.NewFlagSet("floodgate serve", flag.ContinueOnError)
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "Usage: floodgate serve [flags]\n\nRuns the rate limit service: an HTTP/JSON API with /metrics, and the Redis\nprotocol (CL.THROTTLE, FG.CHECK). With no flags it uses the embedded store\nand a built-in rule, \"example\" (10/s, burst 20). Every flag can also be set\nwith the environment variable named in its description.\n\nFlags:\n")
		fs.PrintDefaults()
	}
	f := &serveFlags{}
	var e env
	f.store.register(fs, &e)
	fs.StringVar(&f.config, "config", e.str("FLOODGATE_CONFIG", ""), "rules file (YAML: floodgate rules or an envoyproxy/ratelimit domain), or a directory of them, read with the directories below it; reloaded on SIGHUP and when it changes ($FLOODGATE_CONFIG)")
	fs.StringVar(&f.http, "http", e.str("FLOODGATE_HTTP", "127.0.0.1:8080"), "HTTP API address; empty to disable ($FLOODGATE_HTTP)")
	fs.StringVar(&f.resp, "resp", e.str("FLOODGATE_RESP", "127.0.0.1:6380"), "Redis protocol address; empty to disable ($FLOODGATE_RESP)")
	fs.StringVar(&f.grpc, "grpc", e.str("FLOODGATE_GRPC", ""), "gRPC address for Envoy's rate limit service (envoy.service.ratelimit.v3) and gRPC health; empty (the default) to disable ($FLOODGATE_GRPC)")
	fs.BoolVar(&f.mergeDomains, "merge-domain-config", e.bool("MERGE_DOMAIN_CONFIG", false), mergeDomainsUsage)
	fs.BoolVar(&f.stopIncrement, "stop-cache-key-increment-when-overlimit", e.bool("STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT", false), "an Envoy request over the limit on any descriptor charges none of them, in one script call on Redis ($STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT, as envoyproxy/ratelimit names it)")
	fs.BoolVar(&f.rlsHeaders, "rls-headers", e.bool("LIMIT_RESPONSE_HEADERS_ENABLED", false), "add RateLimit-Limit, RateLimit-Remaining and RateLimit-Reset to Envoy answers ($LIMIT_RESPONSE_HEADERS_ENABLED, as envoyproxy/ratelimit names it)")
	fs.StringVar(&f.token, "token", e.str("FLOODGATE_TOKEN", ""), "require this bearer token on the HTTP API, AUTH on the Redis protocol, and authorization metadata on gRPC calls but health checks, checked before a call's message is read ($FLOODGATE_TOKEN)")
	fs.DurationVar(&f.watch, "watch", e.duration("FLOODGATE_WATCH", time.Second), "how often to look for a changed rules file; a change is reloaded once the file has stayed the same for this long, and one that drops rules in use only once renamed into place, after 30s unchanged, or at SIGHUP; 0 to rely on SIGHUP ($FLOODGATE_WATCH)")
	fs.BoolVar(&f.protectMetrics, "protect-metrics", e.bool("FLOODGATE_PROTECT_METRICS", false), "require --token on /metrics too; by default /metrics, /healthz and /readyz are open ($FLOODGATE_PROTECT_METRICS)")
	fs.Int64Var(&f.httpMaxConns, "http-max-conns", e.int("FLOODGATE_HTTP_MAX_CONNS", 10000), "most open HTTP connections; more wait to be accepted ($FLOODGATE_HTTP_MAX_CONNS)")
	fs.Int64Var(&f.grpcMaxConns, "grpc-max-conns", e.int("FLOODGATE_GRPC_MAX_CONNS", 1000), "most open gRPC connections; more wait to be accepted. Envoy opens one per worker thread, and another when one has --grpc-max-streams calls in flight ($FLOODGATE_GRPC_MAX_CONNS)")
	fs.Int64Var(&f.grpcStreams, "grpc-max-streams", e.int("FLOODGATE_GRPC_MAX_STREAMS", envoy.DefaultMaxStreams), "most gRPC calls in flight on one connection; more are refused unread, and Envoy opens another connection ($FLOODGATE_GRPC_MAX_STREAMS)")
	fs.StringVar(&f.grpcMsgSize, "grpc-max-msg-size", e.str("FLOODGATE_GRPC_MAX_MSG_SIZE", "256KiB"), "largest gRPC rate limit request (bytes, or with KiB, MiB or GiB); a larger one fails, which Envoy answers by letting its request through unless failure_mode_deny. A connection holds at most about --grpc-max-streams times this ($FLOODGATE_GRPC_MAX_MSG_SIZE)")
	fs.DurationVar(&f.grpcLimits.HandshakeTimeout, "grpc-handshake-timeout", e.duration("FLOODGATE_GRPC_HANDSHAKE_TIMEOUT", envoy.DefaultHandshakeTimeout), "how long a new gRPC connection has to finish TLS and send the HTTP/2 preface before it is closed ($FLOODGATE_GRPC_HANDSHAKE_TIMEOUT)")
	fs.DurationVar(&f.grpcLimits.IdleTimeout, "grpc-idle-timeout", e.duration("FLOODGATE_GRPC_IDLE_TIMEOUT", envoy.DefaultIdleTimeout), "close a gRPC connection with no call in flight for this long; the client reconnects when it next calls ($FLOODGATE_GRPC_IDLE_TIMEOUT)")
	fs.BoolVar(&f.ui, "ui", e.bool("FLOODGATE_UI", true), "serve the dashboard at /ui/ on the HTTP listener ($FLOODGATE_UI)")
	fs.StringVar(&f.gcFloor, "gc-floor", e.str("FLOODGATE_GC_FLOOR", "64MiB"), "let the heap grow by at least this much between garbage collections (bytes, or with KiB, MiB or GiB; 0 for Go's default): fewer collections under load, for at most this much more memory; ignored when GOGC is set ($FLOODGATE_GC_FLOOR)")
	fs.DurationVar(&f.uiStep, "ui-step", e.duration("FLOODGATE_UI_STEP", 2*time.Second), "how often the dashboard samples the counters: its chart's resolution ($FLOODGATE_UI_STEP)")
	fs.StringVar(&f.tls.Cert, "tls-cert", e.str("FLOODGATE_TLS_CERT", ""), "PEM certificate (chain) for TLS on the HTTP and Redis-protocol listeners; reloaded on SIGHUP ($FLOODGATE_TLS_CERT)")
	fs.StringVar(&f.tls.Key, "tls-key", e.str("FLOODGATE_TLS_KEY", ""), "PEM private key of --tls-cert ($FLOODGATE_TLS_KEY)")
	f.log.register(fs, &e)
	f.trace.register(fs, &e)
	f.xds.register(fs, &e)
	fs.StringVar(&f.tls.ClientCA, "tls-client-ca", e.str("FLOODGATE_TLS_CLIENT_CA", ""), "PEM CA certificates that clients must present a certificate from (mutual TLS) ($FLOODGATE_TLS_CLIENT_CA)")
	fs.StringVar(&f.trustedProxies, "trusted-proxies", e.str("FLOODGATE_TRUSTED_PROXIES", ""), "comma-separated addresses or CIDR prefixes of the proxies (nginx, Caddy, Traefik) whose --client-ip-header /v1/auth believes for a key's {ip}; without them {ip} is refused ($FLOODGATE_TRUSTED_PROXIES)")
	f.statsd.register(fs, &e)
	fs.StringVar(&f.clientIPHeader, "client-ip-header", e.str("FLOODGATE_CLIENT_IP_HEADER", "X-Forwarded-For"), "the header in which the trusted proxies send the client's address to /v1/auth: X-Forwarded-For, X-Real-IP or Forwarded ($FLOODGATE_CLIENT_IP_HEADER)")
	if code, ok := parseFlags(fs, &e, args, stderr); !ok {
		return nil, code, false
	}
	if f.trustedProxies != "" {
		var addrs []string
		for _, a := range strings.Split(f.trustedProxies, ",") {
			if a = strings.TrimSpace(a); a != "" {
				addrs = append(addrs, a)
			}
		}
		var err error
		if f.trusted, err = httplimit.TrustedProxies(addrs...); err != nil {
			fmt.Fprintf(stderr, "floodgate serve: --trusted-proxies: %v\n", strings.TrimPrefix(err.Error(), "httplimit: "))
			return nil, 2, false
		}
	}
	if _, err := clientip.New(f.clientIPHeader, nil); err != nil {
		fmt.Fprintf(stderr, "floodgate serve: --client-ip-header: %v\n", err)
		return nil, 2, false
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "floodgate serve: unexpected argument %q\n", fs.Arg(0))
		return nil, 2, false
	}
	if _, _, err := f.log.logger(io.Discard, io.Discard); err != nil {
		fmt.Fprintf(stderr, "floodgate serve: %v\n", err)
		return nil, 2, false
	}
	var err error
	if f.traceCfg, err = f.trace.config(os.Getenv); err != nil {
		fmt.Fprintf(stderr, "floodgate serve: %v\n", err)
		return nil, 2, false
	}
	return f, 0, true
}

// server is a running floodgate serve: its listeners and the servers on
// them.
type server struct {
	ui             bool              // the dashboard is served
	tls            *tlsconf.Reloader // nil without TLS
	redisTLS       *tlsconf.Client   // the TLS to Redis; nil without
	xdsTLS         *tlsconf.Client   // the TLS to the xDS server; nil without
	httpLn, respLn net.Listener
	grpcLn         *trackedListener
	httpSrv        *http.Server
	respSrv        *resp.Server
	grpcSrv        *grpc.Server
	rls            *envoy.Server
	// grpcTLS is TLS on the gRPC listener alone (GRPC_SERVER_USE_TLS,
	// started as ratelimit); nil without.
	grpcTLS *tlsconf.Reloader
	// extra are the HTTP listeners of the ratelimit mode: the debug
	// listener (DEBUG_PORT) and Prometheus's (USE_PROMETHEUS).
	extra []extraHTTP
	wg    sync.WaitGroup
	errs  chan error // a server that stopped by itself
}

// listen opens the listeners the flags ask for, and the servers for them.
// Until ready is closed (nil: at once), Envoy's requests fail as
// envoyproxy/ratelimit's do before its first configuration.
func listen(f *serveFlags, rl *envoy.Service, board *dash.Dashboard, ready <-chan struct{}, log *slog.Logger, tp trace.TracerProvider) (*server, error) {
	svc := rl.Rules()
	s := &server{errs: make(chan error, 5), ui: board != nil}
	var err error
	var grpcOpts []grpc.ServerOption
	if f.grpc != "" {
		if grpcOpts, err = grpcOptions(f); err != nil {
			return nil, err
		}
		if tp != nil {
			grpcOpts = append(grpcOpts, tracing.GRPC(tp))
		}
		if ready != nil {
			grpcOpts = append(grpcOpts, grpc.ChainUnaryInterceptor(gateUnary(ready)))
		}
	}
	if f.tls != (tlsconf.Files{}) {
		if s.tls, err = tlsconf.Load(f.tls); err != nil {
			return nil, err
		}
	}
	if f.http != "" {
		if f.httpMaxConns < 1 {
			return nil, fmt.Errorf("--http-max-conns must be at least 1, got %d", f.httpMaxConns)
		}
		if s.httpLn, err = net.Listen("tcp", f.http); err != nil {
			return nil, fmt.Errorf("--http: %w", err)
		}
		s.httpLn = netutil.LimitListener(s.httpLn, int(f.httpMaxConns))
		if s.tls != nil {
			s.httpLn = tls.NewListener(s.httpLn, s.tls.Config())
		}
		httpLog := log.With("component", "http")
		var h http.Handler = httpapi.Handler(svc, &httpapi.Options{Token: f.token, ProtectMetrics: f.protectMetrics, Dashboard: board, Logger: httpLog, Envoy: gateJSON(rl.JSONHandler(log.With("component", "envoy")), ready),
			EnvoyExplain:   rl.ExplainHandler(log.With("component", "envoy")),
			TrustedProxies: f.trusted, ClientIPHeader: f.clientIPHeader})
		if tp != nil {
			h = tracing.HTTP(tp, h)
		}
		s.httpSrv = &http.Server{
			Handler: h,
			// net/http logs each failed accept or TLS handshake: a line a
			// second, through the log, not the global log package.
			ErrorLog:          slog.NewLogLogger(lograte.NewHandler(httpLog.Handler(), time.Second, nil), slog.LevelWarn),
			ReadHeaderTimeout: 10 * time.Second, ReadTimeout: 30 * time.Second, IdleTimeout: 2 * time.Minute,
			MaxHeaderBytes: 64 << 10,
		}
	}
	if f.resp != "" {
		if s.respLn, err = net.Listen("tcp", f.resp); err != nil {
			if s.httpLn != nil {
				s.httpLn.Close()
			}
			return nil, fmt.Errorf("--resp: %w", err)
		}
		if s.tls != nil {
			s.respLn = tls.NewListener(s.respLn, s.tls.Config())
		}
		s.respSrv = resp.New(svc, &resp.Options{Token: f.token, Version: getVersion(), Logger: log.With("component", "resp")})
	}
	if f.grpc != "" {
		ln, err := net.Listen("tcp", f.grpc)
		if err != nil {
			for _, ln := range []net.Listener{s.httpLn, s.respLn} {
				if ln != nil {
					ln.Close()
				}
			}
			return nil, fmt.Errorf("--grpc: %w", err)
		}
		// Each connection's streams, messages and idle time are bounded
		// by grpcOpts; their number, as on the HTTP listener, here.
		s.grpcLn = &trackedListener{Listener: netutil.LimitListener(ln, int(f.grpcMaxConns)), conns: map[*trackedConn]struct{}{}}
		opts := grpcOpts
		if s.tls != nil {
			opts = append(opts, grpc.Creds(credentials.NewTLS(s.tls.Config())))
		} else if u := f.upstream; u != nil && u.grpcTLS != (tlsconf.Files{}) {
			if s.grpcTLS, err = tlsconf.Load(u.grpcTLS); err != nil {
				s.closeListeners()
				return nil, fmt.Errorf("$GRPC_SERVER_TLS_*: %w", err)
			}
			opts = append(opts, grpc.Creds(credentials.NewTLS(s.grpcTLS.Config())))
		}
		s.grpcSrv = grpc.NewServer(opts...)
		s.rls = envoy.Register(s.grpcSrv, rl, log.With("component", "envoy"))
	}
	if s.httpLn == nil && s.respLn == nil && s.grpcLn == nil {
		return nil, errors.New("--http, --resp and --grpc are all disabled: nothing to serve")
	}
	if f.upstream != nil {
		if err := s.listenUpstream(f.upstream, rl, log); err != nil {
			s.closeListeners()
			return nil, err
		}
	}
	return s, nil
}

// closeListeners closes the listeners opened so far, when listen fails.
func (s *server) closeListeners() {
	for _, ln := range []net.Listener{s.httpLn, s.respLn} {
		if ln != nil {
			ln.Close()
		}
	}
	if s.grpcLn != nil {
		s.grpcLn.Close()
	}
	for _, x := range s.extra {
		x.ln.Close()
	}
}

// start serves on the listeners, each in a goroutine that shutdown waits
// for, and prints where.
func (s *server) start(b banner) {
	scheme, tlsNote := "http", ""
	if s.tls != nil {
		scheme, tlsNote = "https", ", TLS"
	}
	if s.httpLn != nil {
		b.line(fmt.Sprintf("HTTP API on %s://%s (POST /v1/check, GET /v1/rules, /metrics)", scheme, s.httpLn.Addr()),
			"listener", "http", "url", fmt.Sprintf("%s://%s", scheme, s.httpLn.Addr()))
		if s.ui {
			b.line(fmt.Sprintf("Dashboard on %s://%s/ui/", scheme, s.httpLn.Addr()),
				"listener", "dashboard", "url", fmt.Sprintf("%s://%s/ui/", scheme, s.httpLn.Addr()))
		}
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			if err := s.httpSrv.Serve(s.httpLn); err != nil && !errors.Is(err, http.ErrServerClosed) {
				s.errs <- fmt.Errorf("HTTP: %w", err)
			}
		}()
	}
	if s.grpcLn != nil {
		b.line(fmt.Sprintf("Envoy rate limit service (gRPC) on %s (envoy.service.ratelimit.v3.RateLimitService%s)", s.grpcLn.Addr(), tlsNote),
			"listener", "grpc", "addr", s.grpcLn.Addr().String(), "tls", s.tls != nil)
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			if err := s.grpcSrv.Serve(s.grpcLn); err != nil {
				s.errs <- fmt.Errorf("gRPC: %w", err)
			}
		}()
	}
	for _, x := range s.extra {
		b.line(fmt.Sprintf("%s on http://%s", x.what, x.ln.Addr()), "listener", x.name, "url", fmt.Sprintf("http://%s", x.ln.Addr()))
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			if err := x.srv.Serve(x.ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
				s.errs <- fmt.Errorf("%s: %w", x.name, err)
			}
		}()
	}
	if s.respLn != nil {
		b.line(fmt.Sprintf("Redis protocol on %s (CL.THROTTLE, FG.CHECK%s)", s.respLn.Addr(), tlsNote),
			"listener", "resp", "addr", s.respLn.Addr().String(), "tls", s.tls != nil)
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			if err := s.respSrv.Serve(s.respLn); err != nil {
				s.errs <- fmt.Errorf("RESP: %w", err)
			}
		}()
	}
}

// traceShutdownGrace bounds the export of the last spans at exit: a
// collector that is down must not hold up a SIGTERM.
const traceShutdownGrace = 300 * time.Millisecond

// shutdownGrace is how long shutdown lets requests in flight finish: a
// decision takes milliseconds, and SIGTERM must end the process within a
// second whatever the clients do.
const shutdownGrace = 700 * time.Millisecond

// shutdown stops accepting, lets in-flight requests finish within
// shutdownGrace, closes what is left, and waits for the servers'
// goroutines.
func (s *server) shutdown() {
	ctx, cancel := context.WithTimeout(context.Background(), shutdownGrace)
	defer cancel()
	var wg sync.WaitGroup
	if s.httpSrv != nil {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if s.httpSrv.Shutdown(ctx) != nil {
				s.httpSrv.Close() // a client still sending: cut it off
			}
		}()
	}
	if s.grpcSrv != nil {
		s.rls.Shutdown()
		wg.Add(1)
		go func() {
			defer wg.Done()
			done := make(chan struct{})
			go func() {
				s.grpcSrv.GracefulStop()
				close(done)
			}()
			select {
			case <-done:
			case <-ctx.Done():
				// Cut off what is still open; Stop would wait for the
				// connections still in their handshake.
				s.grpcLn.closeAll()
				s.grpcSrv.Stop()
				<-done
			}
		}()
	}
	for _, x := range s.extra {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if x.srv.Shutdown(ctx) != nil {
				x.srv.Close()
			}
		}()
	}
	if s.respSrv != nil {
		s.respSrv.Shutdown(ctx)
	}
	wg.Wait()
	s.wg.Wait()
}

func serveCmd(ctx context.Context, args []string, stdout, stderr io.Writer, redisLog func(*slog.Logger)) int {
	f, code, ok := parseServeFlags(args, stderr)
	if !ok {
		return code
	}
	return serveFlagsCmd(ctx, f, stdout, stderr, redisLog)
}

// serveFlagsCmd runs serve with the flags f: floodgate serve's, or those
// that envoyproxy/ratelimit's environment gives when started as
// ratelimit.
func serveFlagsCmd(ctx context.Context, f *serveFlags, stdout, stderr io.Writer, redisLog func(*slog.Logger)) int {
	root, b, err := f.log.logger(stderr, stdout)
	if err != nil { // checked by parseServeFlags
		fmt.Fprintf(stderr, "floodgate serve: %v\n", err)
		return 2
	}
	if redisLog != nil {
		redisLog(root)
	}
	if f.gcFloor != "0" {
		floor, err := parseBytes(f.gcFloor)
		if err != nil {
			fmt.Fprintf(stderr, "floodgate serve: --gc-floor: %v\n", err)
			return 2
		}
		defer gcfloor.Start(uint64(floor)).Stop()
	}
	if u := f.upstream; u != nil {
		for _, n := range u.notes {
			root.Info("ratelimit: "+n, "component", "serve")
		}
		if u.xds != nil {
			if err := configFromXDS(f, u.xds); err != nil {
				fmt.Fprintf(stderr, "ratelimit: %v\n", err)
				return 2
			}
		}
	}
	var sink *statsd.Sink
	so, err := f.statsd.options()
	if err == nil && so == nil && f.upstream != nil {
		so = f.upstream.statsd
	}
	if err == nil && so != nil {
		so.Logger = root.With("component", "statsd")
		sink, err = statsd.New(*so)
	}
	if err != nil {
		fmt.Fprintf(stderr, "floodgate serve: %v\n", err)
		return 2
	}
	if sink != nil {
		defer sink.Close()
	}
	xs, err := f.xds.check(f.config, f.mergeDomains)
	if err != nil {
		fmt.Fprintf(stderr, "floodgate serve: %v\n", err)
		return 2
	}
	files, _ := scan(f.config, nil) // before reading, so that no change is missed
	cfg, err := loadRules(f.config, config.LoadOptions{MergeDomains: f.mergeDomains})
	if err != nil {
		fmt.Fprintf(stderr, "floodgate serve: invalid rules file:\n%v\n", err)
		return 2
	}
	if xs != nil {
		cfg = xdsConfig()
	}
	// The dashboard hears the fallback's switches and the service's
	// denials, and reads the service: it is made last, and set before
	// anything is served.
	var board *dash.Dashboard
	var onSwitch func(fallback.State)
	var onDenied, onAcquired func(rule, key string)
	if f.ui {
		onSwitch = func(s fallback.State) { board.Switched(s) }
		onDenied = func(rule, key string) { board.Denied(rule, key) }
		onAcquired = func(rule, key string) { board.Acquired(rule, key) }
	}
	tr, err := startTracing(f.traceCfg, root.With("component", "tracing"))
	if err != nil {
		fmt.Fprintf(stderr, "floodgate serve: %v\n", err)
		return 2
	}
	// Last, after the servers stopped: the spans of their last requests
	// are sent, within a bound, as SIGTERM must end the process promptly.
	defer func() {
		ctx, cancel := context.WithTimeout(context.Background(), traceShutdownGrace)
		tr.shutdown(ctx)
		cancel()
	}()
	var tp trace.TracerProvider // nil, not a nil *TracerProvider, when off
	if tr != nil {
		tp = tr.tp
	}
	st, err := openStore(&f.store, root, onSwitch)
	if err != nil {
		fmt.Fprintf(stderr, "floodgate serve: %v\n", err)
		return 2
	}
	defer st.close()
	eo := envoy.Options{}
	if f.upstream != nil {
		eo = f.upstream.envoy
	}
	eo.StopIncrementWhenOverLimit, eo.RateLimitHeaders, eo.StatsD = f.stopIncrement, f.rlsHeaders, sink
	rl, err := envoy.New(st.store, cfg, &service.Options{Fallback: st.fallback, Memory: st.memory, Logger: root.With("component", "service"), OnDenied: onDenied, OnAcquired: onAcquired, MergeDomains: f.mergeDomains,
		TracerProvider: tp, TraceKeys: f.trace.keys}, &eo)
	if err != nil {
		fmt.Fprintf(stderr, "floodgate serve: %v\n", err)
		return 2
	}
	svc := rl.Rules()
	if st.monitor != nil {
		redisMetrics(svc.Metrics, st.monitor)
	}
	if sink != nil {
		svc.Metrics.NewCounterFunc("floodgate_statsd_dropped_total", "StatsD packets and timer samples dropped: their bounded queue was full, or the StatsD server refused or was unreachable. Decisions never wait for StatsD.", sink.Dropped)
		svc.Metrics.NewCounterFunc("floodgate_statsd_packets_total", "StatsD packets written.", sink.Sent)
	}
	if f.ui {
		o := &dash.Options{Store: st.desc, Step: f.uiStep}
		o.Domains = func() []dash.Domain {
			var out []dash.Domain
			for _, d := range rl.Domains() {
				out = append(out, dash.Domain(d))
			}
			return out
		}
		if st.monitor != nil {
			o.Redis = func() dash.Redis { return dashRedis(st.monitor.Status()) }
		}
		board = dash.New(svc, o)
		defer board.Close()
	}
	if st.fallback != nil {
		// Readiness reflects Redis from the start: an unreachable Redis
		// opens the breaker now (and is logged), not after three failed
		// decisions.
		ctx, cancel := context.WithTimeout(ctx, max(f.store.budget, time.Second))
		st.fallback.Probe(ctx)
		cancel()
	}
	if st.monitor != nil {
		// Its first reading logs a policy that evicts limits before
		// anything is served.
		ctx, cancel := context.WithTimeout(ctx, max(f.store.budget, time.Second))
		st.monitor.Start(ctx)
		cancel()
	}
	var ready <-chan struct{} // closed once there is a configuration to answer by
	if xs != nil {
		source := xds.Source + " " + f.xds.server
		xc, err := startXDS(xs, func(c *config.Config, err error) error { return svc.Apply(source, c, err) }, svc.Metrics, root.With("component", "xds"))
		if err != nil {
			fmt.Fprintf(stderr, "floodgate serve: %v\n", err)
			return 2
		}
		defer xc.Stop()
		if f.xds.startWithoutConfig {
			ready = xc.Applied()
		} else if !waitXDS(ctx, xc, f.xds.server, root) {
			return 0
		}
	}
	srv, err := listen(f, rl, board, ready, root, tp)
	if err != nil {
		fmt.Fprintf(stderr, "floodgate serve: %v\n", err)
		return 2
	}
	srv.redisTLS = st.redisTLS
	if xs != nil {
		srv.xdsTLS = xs.tls
	}
	b.line("floodgate "+versionLine(), "version", getVersion())
	b.line("store: "+st.desc, "store", st.desc)
	b.line(fmt.Sprintf("rules: %d from %s", len(cfg.Rules), cfg.Source), "rules", len(cfg.Rules), "source", cfg.Source)
	if xs != nil {
		n := len(svc.Config().Domains)
		b.line(fmt.Sprintf("envoy domains: %d from xDS server %s (node %s)", n, f.xds.server, f.xds.nodeID), "domains", n, "xds_server", f.xds.server, "xds_node", f.xds.nodeID)
	} else if len(cfg.Domains) > 0 {
		b.line(fmt.Sprintf("envoy domains: %d from %s", len(cfg.Domains), cfg.Source), "domains", len(cfg.Domains), "source", cfg.Source)
	}
	if sink != nil {
		b.line(fmt.Sprintf("StatsD to %s over %s, every %s", so.Addr, so.Network, so.FlushInterval), "statsd", so.Addr, "network", so.Network)
	}
	srv.start(b)
	if s, ok := stdout.(interface{ Sync() error }); ok {
		s.Sync()
	}
	code := serveLoop(ctx, f, svc, srv, files, root)
	srv.shutdown()
	return code
}

// serveLoop waits for a signal, a failed server or the end of ctx, and reloads
// the rules on SIGHUP and, with --watch, when the file changes. It returns
// the exit status.
func serveLoop(ctx context.Context, f *serveFlags, svc *service.Service, srv *server, files snapshot, root *slog.Logger) int {
	log := root.With("component", "serve")
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGHUP, syscall.SIGINT, syscall.SIGTERM)
	defer signal.Stop(sigs)
	stopWatch := make(chan struct{})
	var watchWG sync.WaitGroup
	defer func() {
		close(stopWatch)
		watchWG.Wait()
	}()
	// The rules' limits, recorded in the store: keys of a rule that changed
	// while floodgate was down are carried to the new limits (on_change).
	rebaseCtx, stopRebase := context.WithTimeout(ctx, service.RebaseTimeout)
	defer stopRebase()
	watchWG.Add(1)
	go func() {
		defer watchWG.Done()
		svc.Rebase(rebaseCtx)
	}()
	// With --watch the watcher reloads the rules, on SIGHUP too, so that
	// it knows which files are in use.
	var hup chan struct{}
	if f.config != "" && f.watch > 0 {
		hup = make(chan struct{}, 1)
		w := &watcher{path: f.config, settle: f.watch, removeSettle: max(removeSettle, 5*f.watch), log: root.With("component", "config"),
			load:    func() (*config.Config, error) { return svc.Load(f.config) },
			apply:   func(cfg *config.Config, err error) { svc.Apply(f.config, cfg, err) },
			current: svc.Config, applied: files}
		watchWG.Add(1)
		go func() {
			defer watchWG.Done()
			w.run(f.watch, stopWatch, hup)
		}()
	}
	for {
		select {
		case sig := <-sigs:
			if sig == syscall.SIGHUP {
				reload(f, svc, srv, hup, log)
				continue
			}
			log.Info("floodgate: shutting down", "signal", sig.String())
			return 0
		case err := <-srv.errs:
			log.Error("floodgate: server failed", "error", err.Error())
			return 1
		case <-ctx.Done():
			return 0
		}
	}
}

// removeSettle is how long a rules file that --watch sees drop rules in
// use, written in place, must stay the same before it is reloaded: longer
// than any writer stalls mid-file.
const removeSettle = 30 * time.Second

// reload reloads, on SIGHUP, the rules file (through the watcher's hup
// when it watches) and the TLS certificates; a file that fails to load
// is logged and what was loaded stays in use.
func reload(f *serveFlags, svc *service.Service, srv *server, hup chan struct{}, log *slog.Logger) {
	if srv.grpcTLS != nil {
		if err := srv.grpcTLS.Reload(); err != nil {
			log.Error("floodgate: gRPC TLS files invalid; keeping the certificates in use", "error", err.Error())
		} else {
			log.Info("floodgate: gRPC TLS certificates reloaded")
		}
	}
	if f.config == "" && srv.tls == nil && srv.redisTLS == nil && srv.xdsTLS == nil {
		log.Info("floodgate: SIGHUP without --config or TLS: nothing to reload")
		return
	}
	switch {
	case f.config != "" && hup != nil:
		select {
		case hup <- struct{}{}:
		default: // a reload is due already
		}
	case f.config != "":
		svc.Reload(f.config)
	}
	if srv.tls != nil {
		if err := srv.tls.Reload(); err != nil {
			log.Error("floodgate: TLS files invalid; keeping the certificates in use", "error", err.Error())
		} else {
			log.Info("floodgate: TLS certificates reloaded")
		}
	}
	if srv.xdsTLS != nil {
		// The next stream to the xDS server uses what was read.
		if err := srv.xdsTLS.Reload(); err != nil {
			log.Error("floodgate: xDS TLS files invalid; keeping the certificates in use", "error", err.Error())
		} else {
			log.Info("floodgate: xDS TLS certificates reloaded")
		}
	}
	if srv.redisTLS != nil {
		// New connections to Redis use what was read; open ones keep
		// theirs until go-redis replaces them.
		if err := srv.redisTLS.Reload(); err != nil {
			log.Error("floodgate: Redis TLS files invalid; keeping the certificates in use", "error", err.Error())
		} else {
			log.Info("floodgate: Redis TLS certificates reloaded")
			warnExpiry(srv.redisTLS, log)
		}
	}
}

// redisMetrics registers the Redis servers' eviction policy, evictions and
// restarts, as the monitor last read them, with m.
func redisMetrics(m *metrics.Registry, mon *redisstore.Monitor) {
	m.NewGaugeVecFunc("floodgate_redis_maxmemory_policy_info", "Redis masters by maxmemory-policy (unknown: not readable); every policy but noeviction evicts limits' keys, and an evicted key is a full limit.",
		[]string{"policy"}, func() []metrics.Labeled {
			var out []metrics.Labeled
			for p, n := range mon.Status().Policies {
				out = append(out, metrics.Labeled{Values: []string{p}, Value: float64(n)})
			}
			return out
		})
	m.NewCounterFunc("floodgate_redis_evicted_keys_total", "Keys the Redis masters evicted (all keys, not only floodgate's), summed over their restarts, as last read.", func() uint64 { return mon.Status().EvictedKeys })
	m.NewCounterFunc("floodgate_redis_restarts_total", "Times a Redis master's run_id changed: a restart (which loses every limit without persistence) or a failover.", func() uint64 { return mon.Status().Restarts })
}

// dashRedis is what the dashboard shows of a monitor's status.
func dashRedis(st redisstore.ServerStatus) dash.Redis {
	r := dash.Redis{EvictedKeys: st.EvictedKeys, Restarts: st.Restarts}
	for p := range st.Policies {
		r.Policies = append(r.Policies, p)
		if redisstore.EvictsLimits(p) {
			r.Evicts = true
		}
	}
	slices.Sort(r.Policies)
	return r
}

// grpcOptions checks the --grpc-* flags and returns the gRPC server's
// options for them and --token.
func grpcOptions(f *serveFlags) ([]grpc.ServerOption, error) {
	if f.grpcMaxConns < 1 {
		return nil, fmt.Errorf("--grpc-max-conns ($FLOODGATE_GRPC_MAX_CONNS) must be at least 1, got %d", f.grpcMaxConns)
	}
	// HTTP/2 numbers a connection's streams with 31 bits.
	if f.grpcStreams < 1 || f.grpcStreams > math.MaxInt32 {
		return nil, fmt.Errorf("--grpc-max-streams ($FLOODGATE_GRPC_MAX_STREAMS) must be 1 to %d, got %d", math.MaxInt32, f.grpcStreams)
	}
	size, err := parseBytes(f.grpcMsgSize)
	if err == nil && size > maxGRPCMsgSize {
		err = fmt.Errorf("%s is more than the maximum 1GiB", f.grpcMsgSize)
	}
	if err != nil {
		return nil, fmt.Errorf("--grpc-max-msg-size ($FLOODGATE_GRPC_MAX_MSG_SIZE): %w", err)
	}
	if f.grpcLimits.HandshakeTimeout <= 0 {
		return nil, fmt.Errorf("--grpc-handshake-timeout ($FLOODGATE_GRPC_HANDSHAKE_TIMEOUT) must be positive, got %s", f.grpcLimits.HandshakeTimeout)
	}
	if f.grpcLimits.IdleTimeout <= 0 {
		return nil, fmt.Errorf("--grpc-idle-timeout ($FLOODGATE_GRPC_IDLE_TIMEOUT) must be positive, got %s", f.grpcLimits.IdleTimeout)
	}
	l := f.grpcLimits
	l.MaxStreams, l.MaxMsgSize, l.Token = uint32(f.grpcStreams), int(size), f.token
	return envoy.ServerOptions(l)
}

// maxGRPCMsgSize bounds --grpc-max-msg-size, in bytes: each of a
// connection's --grpc-max-streams calls may hold that much, and a
// larger limit would bound nothing.
const maxGRPCMsgSize = 1 << 30

// trackedListener keeps the connections it accepted until they close, so
// that shutdown can close those that gRPC's Stop would wait for: one in
// its TLS handshake or before its HTTP/2 preface is only given up at
// --grpc-handshake-timeout.
type trackedListener struct {
	net.Listener
	mu     sync.Mutex
	conns  map[*trackedConn]struct{}
	closed bool // closeAll was called: what is accepted is closed at once
}

// Accept returns the next connection, tracked until it is closed.
func (l *trackedListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		tc := &trackedConn{Conn: c, l: l}
		l.mu.Lock()
		closed := l.closed
		if !closed {
			l.conns[tc] = struct{}{}
		}
		l.mu.Unlock()
		if !closed {
			return tc, nil
		}
		c.Close()
	}
}

// closeAll closes the connections open now and any accepted later.
func (l *trackedListener) closeAll() {
	l.mu.Lock()
	l.closed = true
	conns := make([]*trackedConn, 0, len(l.conns))
	for c := range l.conns {
		conns = append(conns, c)
	}
	l.mu.Unlock()
	for _, c := range conns {
		c.Close()
	}
}

// trackedConn is a connection of a trackedListener.
type trackedConn struct {
	net.Conn
	l *trackedListener
}

// Close closes the connection and forgets it.
func (c *trackedConn) Close() error {
	c.l.mu.Lock()
	delete(c.l.conns, c)
	c.l.mu.Unlock()
	return c.Conn.Close()
}
