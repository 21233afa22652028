package main

import (
	"context"
	"crypto/tls"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/floodgate/floodgate/internal/lib/httpjson"
	"github.com/floodgate/floodgate/internal/server/config"
	"github.com/floodgate/floodgate/internal/server/metrics"
	"github.com/floodgate/floodgate/internal/server/tlsconf"
	"github.com/floodgate/floodgate/internal/server/xds"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// xdsFlags take the Envoy domains from an xDS management server
// (envoyproxy/ratelimit's CONFIG_TYPE=GRPC_XDS_SOTW and its
// CONFIG_GRPC_XDS_* settings).
type xdsFlags struct {
	server       string // --xds-server; "" for none
	nodeID       string
	nodeMetadata string // key=value,...
	headers      string // key=value,... (or key:value)
	tls          bool   // --xds-tls: TLS with the system's roots
	tlsFiles     tlsconf.ClientFiles
	backoffMin   time.Duration
	backoffMax   time.Duration
	maxMsgSize   string
	// startWithoutConfig listens before the first configuration came,
	// failing Envoy's requests until it does.
	startWithoutConfig bool
}

func (x *xdsFlags) register(fs *flag.FlagSet, e *env) {
	fs.StringVar(&x.server, "xds-server", e.str("FLOODGATE_XDS_SERVER", ""), "take the Envoy domains from this xDS management server, host:port (Envoy Gateway's rate limit xDS): a state-of-the-world subscription to RateLimitConfig resources, as envoyproxy/ratelimit's CONFIG_TYPE=GRPC_XDS_SOTW; instead of --config ($FLOODGATE_XDS_SERVER)")
	fs.StringVar(&x.nodeID, "xds-node-id", e.str("FLOODGATE_XDS_NODE_ID", xds.DefaultNodeID), "the node id sent to --xds-server, which keys its snapshots by it ($FLOODGATE_XDS_NODE_ID)")
	fs.StringVar(&x.nodeMetadata, "xds-node-metadata", e.str("FLOODGATE_XDS_NODE_METADATA", ""), "the node's metadata sent to --xds-server, comma-separated key=value pairs ($FLOODGATE_XDS_NODE_METADATA)")
	fs.StringVar(&x.headers, "xds-headers", e.str("FLOODGATE_XDS_HEADERS", ""), "gRPC metadata sent on the xDS stream, comma-separated name=value (or name:value) pairs, such as an authorization header ($FLOODGATE_XDS_HEADERS)")
	fs.BoolVar(&x.tls, "xds-tls", e.bool("FLOODGATE_XDS_TLS", false), "TLS to --xds-server, checked against the system's roots unless --xds-tls-ca; any --xds-tls-* flag turns it on too ($FLOODGATE_XDS_TLS)")
	fs.StringVar(&x.tlsFiles.CA, "xds-tls-ca", e.str("FLOODGATE_XDS_TLS_CA", ""), "PEM CA certificates that --xds-server's certificate must chain to; reloaded on SIGHUP ($FLOODGATE_XDS_TLS_CA)")
	fs.StringVar(&x.tlsFiles.Cert, "xds-tls-cert", e.str("FLOODGATE_XDS_TLS_CERT", ""), "PEM client certificate (chain) to present to --xds-server (mutual TLS); reloaded on SIGHUP ($FLOODGATE_XDS_TLS_CERT)")
	fs.StringVar(&x.tlsFiles.Key, "xds-tls-key", e.str("FLOODGATE_XDS_TLS_KEY", ""), "PEM private key of --xds-tls-cert ($FLOODGATE_XDS_TLS_KEY)")
	fs.StringVar(&x.tlsFiles.ServerName, "xds-tls-server-name", e.str("FLOODGATE_XDS_TLS_SERVER_NAME", ""), "name that --xds-server's certificate must hold; by default its host ($FLOODGATE_XDS_TLS_SERVER_NAME)")
	fs.DurationVar(&x.backoffMin, "xds-backoff-min", e.duration("FLOODGATE_XDS_BACKOFF_MIN", xds.DefaultBackoffMin), "first wait before the xDS stream is opened again after it failed; it doubles with each failure in a row, drawn from its upper half ($FLOODGATE_XDS_BACKOFF_MIN)")
	fs.DurationVar(&x.backoffMax, "xds-backoff-max", e.duration("FLOODGATE_XDS_BACKOFF_MAX", xds.DefaultBackoffMax), "longest wait before the xDS stream is opened again ($FLOODGATE_XDS_BACKOFF_MAX)")
	fs.StringVar(&x.maxMsgSize, "xds-max-msg-size", e.str("FLOODGATE_XDS_MAX_MSG_SIZE", "4MiB"), "largest xDS response (bytes, or with KiB, MiB or GiB): the whole configuration comes in one ($FLOODGATE_XDS_MAX_MSG_SIZE)")
	fs.BoolVar(&x.startWithoutConfig, "xds-start-without-config", e.bool("FLOODGATE_XDS_START_WITHOUT_CONFIG", false), "listen before the first configuration came from --xds-server; until it comes, Envoy's requests fail with \"no rate limit configuration loaded\" (Envoy's failure mode decides), as envoyproxy/ratelimit's FORCE_START_WITHOUT_INITIAL_CONFIG does; by default serve waits for it before it listens ($FLOODGATE_XDS_START_WITHOUT_CONFIG)")
}

// xdsSetup is what the xDS flags ask for, checked.
type xdsSetup struct {
	opts xds.Options // but Apply and Logger
	tls  *tlsconf.Client
}

// check checks the xDS flags, given --config and --merge-domain-config,
// and loads the TLS files. It returns nil without --xds-server.
func (x *xdsFlags) check(configPath string, mergeDomains bool) (*xdsSetup, error) {
	tlsOn := x.tls || x.tlsFiles != (tlsconf.ClientFiles{})
	if x.server == "" {
		if tlsOn || x.nodeMetadata != "" || x.headers != "" || x.startWithoutConfig {
			return nil, errors.New("--xds-* flags need --xds-server")
		}
		return nil, nil
	}
	if configPath != "" {
		return nil, errors.New("--config and --xds-server both give the Envoy domains: set one (the container image sets FLOODGATE_CONFIG: set it to the empty string)")
	}
	s := &xdsSetup{opts: xds.Options{Server: x.server, NodeID: x.nodeID, BackoffMin: x.backoffMin, BackoffMax: x.backoffMax, MergeDomains: mergeDomains}}
	if x.nodeID == "" {
		return nil, errors.New("--xds-node-id ($FLOODGATE_XDS_NODE_ID) is empty")
	}
	var err error
	if s.opts.NodeMetadata, err = pairs(x.nodeMetadata, "="); err != nil {
		return nil, fmt.Errorf("--xds-node-metadata ($FLOODGATE_XDS_NODE_METADATA): %w", err)
	}
	if s.opts.Headers, err = pairs(x.headers, "=:"); err != nil {
		return nil, fmt.Errorf("--xds-headers ($FLOODGATE_XDS_HEADERS): %w", err)
	}
	for name := range s.opts.Headers {
		if !headerName(name) {
			return nil, fmt.Errorf("--xds-headers ($FLOODGATE_XDS_HEADERS): %q is not a header name (letters, digits, '-', '_' and '.')", name)
		}
	}
	if x.backoffMin <= 0 || x.backoffMax < x.backoffMin {
		return nil, fmt.Errorf("--xds-backoff-min (%s) must be positive and at most --xds-backoff-max (%s)", x.backoffMin, x.backoffMax)
	}
	size, err := parseBytes(x.maxMsgSize)
	if err == nil && size > maxGRPCMsgSize {
		err = fmt.Errorf("%s is more than the maximum 1GiB", x.maxMsgSize)
	}
	if err != nil {
		return nil, fmt.Errorf("--xds-max-msg-size ($FLOODGATE_XDS_MAX_MSG_SIZE): %w", err)
	}
	s.opts.MaxMsgSize = int(size)
	if tlsOn {
		host, _, err := net.SplitHostPort(x.server)
		if err != nil {
			return nil, fmt.Errorf("--xds-server %q: %w", x.server, err)
		}
		if s.tls, err = tlsconf.LoadClient(x.tlsFiles); err != nil {
			return nil, fmt.Errorf("--xds-tls-*: %w", err)
		}
		c := s.tls
		s.opts.TLS = func() *tls.Config { return c.Config(host) }
	}
	return s, nil
}

// pairs reads "k=v,k2=v2" into a map, each pair split at its first
// character from seps. Blank entries are skipped.
func pairs(s, seps string) (map[string]string, error) {
	if strings.TrimSpace(s) == "" {
		return nil, nil
	}
	m := map[string]string{}
	for _, p := range strings.Split(s, ",") {
		if strings.TrimSpace(p) == "" {
			continue
		}
		i := strings.IndexAny(p, seps)
		if i <= 0 {
			return nil, fmt.Errorf("%q is not key%cvalue", p, seps[0])
		}
		k := strings.TrimSpace(p[:i])
		if k == "" {
			return nil, fmt.Errorf("%q has an empty key", p)
		}
		if _, dup := m[k]; dup {
			return nil, fmt.Errorf("%q is given twice", k)
		}
		m[k] = strings.TrimSpace(p[i+1:])
	}
	return m, nil
}

// headerName reports whether s is a gRPC metadata key: ASCII letters,
// digits, '-', '_' and '.'.
func headerName(s string) bool {
	for _, r := range s {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-' || r == '_' || r == '.') {
			return false
		}
	}
	return s != ""
}

// xdsConfig is the configuration serve starts with under --xds-server:
// no rules, no domains, until the server sends them.
func xdsConfig() *config.Config {
	cfg, err := config.FromDomains(xds.Source, nil, false)
	if err != nil {
		panic("an empty configuration is invalid: " + err.Error()) // a bug, caught by the tests
	}
	return cfg
}

// startXDS starts the xDS client, whose configurations apply swaps in,
// and registers its metrics.
func startXDS(s *xdsSetup, apply func(*config.Config, error) error, m *metrics.Registry, log *slog.Logger) (*xds.Client, error) {
	o := s.opts
	o.Apply, o.Logger = apply, log
	c, err := xds.Start(o)
	if err != nil {
		return nil, err
	}
	m.NewGaugeFunc("floodgate_xds_connected", "1 while the stream to the xDS server is open and has had a response, else 0.", func() float64 {
		if c.Status().Connected {
			return 1
		}
		return 0
	})
	m.NewCounterFunc("floodgate_xds_applied_total", "xDS responses applied (ACKed).", func() uint64 { return c.Status().Applied })
	m.NewCounterFunc("floodgate_xds_rejected_total", "xDS responses refused (NACKed); the configuration in use stays.", func() uint64 { return c.Status().Rejected })
	return c, nil
}

// waitXDS waits for the client's first configuration, as
// envoyproxy/ratelimit waits for its first before it serves. It returns
// false when serve should stop instead: ctx ended, or SIGINT or SIGTERM.
func waitXDS(ctx context.Context, c *xds.Client, server string, log *slog.Logger) bool {
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM)
	defer signal.Stop(sigs)
	log.Info("floodgate: waiting for the first configuration from the xDS server before serving", "server", server)
	select {
	case <-c.Applied():
		return true
	case sig := <-sigs:
		log.Info("floodgate: shutting down", "signal", sig.String())
		return false
	case <-ctx.Done():
		return false
	}
}

// errNoConfig is envoyproxy/ratelimit's answer, over gRPC and /json,
// while it has no configuration (started with
// FORCE_START_WITHOUT_INITIAL_CONFIG, as Envoy Gateway starts it): Envoy
// applies its failure mode.
const errNoConfig = "no rate limit configuration loaded"

// shouldRateLimit is the full name of the gRPC method that gateUnary
// holds back.
const shouldRateLimit = "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit"

// gateUnary fails ShouldRateLimit calls with errNoConfig until ready is
// closed; health checks pass.
func gateUnary(ready <-chan struct{}) grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		if info.FullMethod == shouldRateLimit {
			select {
			case <-ready:
			default:
				return nil, status.Error(codes.Unknown, errNoConfig)
			}
		}
		return handler(ctx, req)
	}
}

// gateJSON answers /json with 400 and errNoConfig, as envoyproxy/ratelimit
// does, until ready is closed; nil ready is closed.
func gateJSON(h http.Handler, ready <-chan struct{}) http.Handler {
	if ready == nil {
		return h
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-ready:
			h.ServeHTTP(w, r)
		default:
			httpjson.Problem(w, http.StatusBadRequest, errNoConfig)
		}
	})
}

// configFromXDS sets the --xds-* flags from envoyproxy/ratelimit's
// CONFIG_GRPC_XDS_* and XDS_CLIENT_* variables, read into x when started
// as ratelimit with CONFIG_TYPE=GRPC_XDS_SOTW. The variable, not a file,
// then gives the configuration, so a --config from the image's
// FLOODGATE_CONFIG is dropped rather than refused.
func configFromXDS(f *serveFlags, x *XDSSettings) error {
	if x.ServerURL == "" {
		return errors.New("$CONFIG_GRPC_XDS_SERVER_URL is empty")
	}
	f.config = ""
	f.xds.server = x.ServerURL
	f.xds.nodeID = x.NodeID
	f.xds.nodeMetadata = joinPairs(x.NodeMetadata)
	f.xds.headers = joinPairs(x.AdditionalHeaders)
	if x.UseTLS {
		// Upstream reads the files only with TLS on; any of them turns
		// floodgate's TLS on, so they are not set without it.
		f.xds.tls = true
		f.xds.tlsFiles = tlsconf.ClientFiles{CA: x.ServerCA, Cert: x.ClientCert, Key: x.ClientKey, ServerName: x.ServerSAN}
	}
	if x.BackoffInitial > 0 {
		f.xds.backoffMin = x.BackoffInitial
	}
	if x.BackoffMax > 0 {
		f.xds.backoffMax = x.BackoffMax
	}
	if x.MaxMsgSize > 0 {
		f.xds.maxMsgSize = strconv.Itoa(x.MaxMsgSize)
	}
	f.xds.startWithoutConfig = x.ForceStart
	return nil
}

// joinPairs writes m as the --xds-node-metadata and --xds-headers flags
// read it, key=value,..., in key order.
func joinPairs(m map[string]string) string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var b strings.Builder
	for i, k := range keys {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(k + "=" + m[k])
	}
	return b.String()
}
