package xds

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"strings"
	"sync"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	rpcstatus "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/floodgate/floodgate/internal/server/config"
)

// Options configure a Client. Server and Apply are required.
type Options struct {
	// Server is the management server's address, host:port (or any gRPC
	// target).
	Server string
	// NodeID is the node's id, which the server keys its snapshots by.
	// Default: "default", as envoyproxy/ratelimit's.
	NodeID string
	// NodeMetadata is the node's metadata, as string values. Default:
	// none.
	NodeMetadata map[string]string
	// Headers are sent as gRPC metadata on each stream (an
	// authorization token, say). Default: none.
	Headers map[string]string
	// TLS, when set, returns the TLS configuration of each new
	// connection, so that certificates reloaded since are used. Default:
	// nil, plain text.
	TLS func() *tls.Config
	// MaxMsgSize bounds a response, in bytes. Default: 4 MiB, gRPC's.
	MaxMsgSize int
	// MergeDomains lets two resources give one domain, as
	// MERGE_DOMAIN_CONFIG lets two files (see Convert).
	MergeDomains bool
	// BackoffMin and BackoffMax bound the wait before a failed stream is
	// opened again: it starts at BackoffMin, doubles with each failure up
	// to BackoffMax, and is drawn at random from its upper half so that
	// many instances spread out; a response resets it. Defaults: 500ms
	// and 30s.
	BackoffMin, BackoffMax time.Duration
	// Apply swaps in cfg, a response's configuration, or, when err is
	// set, records that the response was refused (err says why) and keeps
	// the configuration in use. What it returns is NACKed: an error of
	// its own refuses cfg. Required; called from the Client's goroutine,
	// one response at a time.
	Apply func(cfg *config.Config, err error) error
	// Logger receives the connections, updates and refusals. Default:
	// slog.Default().
	Logger *slog.Logger
	// After is the backoff's clock. Default: time.After.
	After func(time.Duration) <-chan time.Time
}

// Default option values.
const (
	DefaultNodeID     = "default"
	DefaultBackoffMin = 500 * time.Millisecond
	DefaultBackoffMax = 30 * time.Second
	DefaultMaxMsgSize = 4 << 20
)

// maxErrorDetail bounds the message of a NACK, in bytes: a response
// with many bad descriptors has an error for each.
const maxErrorDetail = 4 << 10

// Status is what a Client has done so far.
type Status struct {
	// Connected is true while a stream is open and has had a response.
	Connected bool
	// Version is the version_info of the configuration applied last, ""
	// before the first.
	Version string
	// Applied and Rejected count the responses ACKed and NACKed.
	Applied, Rejected uint64
	// LastError is why the last response was NACKed, or the stream last
	// failed; "" when neither happened since the last applied response.
	LastError string
}

// Client subscribes to a management server's RateLimitConfigs and applies
// each response, from a goroutine of its own that Stop ends.
type Client struct {
	o      Options
	log    *slog.Logger
	cancel context.CancelFunc
	done   chan struct{}
	// first is closed when the first configuration is applied.
	first     chan struct{}
	firstOnce sync.Once

	mu sync.Mutex
	st Status
}

// Start checks o and starts the client's goroutine, which connects at
// once and runs until Stop. The Client holds no connection while it
// waits out a backoff.
func Start(o Options) (*Client, error) {
	switch {
	case o.Server == "":
		return nil, errors.New("xds: no server address")
	case o.Apply == nil:
		return nil, errors.New("xds: no Apply")
	case o.MaxMsgSize < 0:
		return nil, fmt.Errorf("xds: a negative MaxMsgSize %d", o.MaxMsgSize)
	case o.BackoffMin < 0 || o.BackoffMax < 0:
		return nil, fmt.Errorf("xds: a negative backoff %s, %s", o.BackoffMin, o.BackoffMax)
	}
	if o.NodeID == "" {
		o.NodeID = DefaultNodeID
	}
	if o.MaxMsgSize == 0 {
		o.MaxMsgSize = DefaultMaxMsgSize
	}
	if o.BackoffMin == 0 {
		o.BackoffMin = DefaultBackoffMin
	}
	if o.BackoffMax == 0 {
		o.BackoffMax = DefaultBackoffMax
	}
	if o.BackoffMax < o.BackoffMin {
		return nil, fmt.Errorf("xds: the backoff's maximum %s is below its minimum %s", o.BackoffMax, o.BackoffMin)
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	if o.After == nil {
		o.After = time.After
	}
	ctx, cancel := context.WithCancel(context.Background())
	c := &Client{o: o, log: o.Logger, cancel: cancel, done: make(chan struct{}), first: make(chan struct{})}
	go c.run(ctx)
	return c, nil
}

// Stop ends the client's stream and goroutine, and waits for them.
func (c *Client) Stop() {
	c.cancel()
	<-c.done
}

// Applied is closed once the client has applied a configuration: serve
// waits for it before it answers, as envoyproxy/ratelimit waits for its
// first configuration.
func (c *Client) Applied() <-chan struct{} { return c.first }

// Status returns what the client has done so far.
func (c *Client) Status() Status {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.st
}

func (c *Client) update(f func(*Status)) {
	c.mu.Lock()
	f(&c.st)
	c.mu.Unlock()
}

// run opens a stream, and again after a backoff each time it fails,
// until ctx ends.
func (c *Client) run(ctx context.Context) {
	defer close(c.done)
	failures := 0
	for {
		got, err := c.session(ctx)
		c.update(func(s *Status) { s.Connected = false })
		if ctx.Err() != nil {
			return
		}
		if got {
			failures = 0
		}
		wait := c.backoff(failures)
		failures++
		c.update(func(s *Status) { s.LastError = err.Error() })
		c.log.Warn("floodgate: xDS stream failed; keeping the configuration in use and connecting again",
			"server", c.o.Server, "error", err.Error(), "retry_in", wait.Round(time.Millisecond).String())
		select {
		case <-ctx.Done():
			return
		case <-c.o.After(wait):
		}
	}
}

// backoff is the wait after the n+1th failure in a row: BackoffMin
// doubled n times, at most BackoffMax, less up to half of it at random.
func (c *Client) backoff(n int) time.Duration {
	d := c.o.BackoffMin
	for range n {
		if d >= c.o.BackoffMax/2 {
			d = c.o.BackoffMax
			break
		}
		d *= 2
	}
	d = min(d, c.o.BackoffMax)
	if half := int64(d / 2); half > 0 {
		d -= time.Duration(rand.Int64N(half + 1))
	}
	return d
}

// session runs one stream: it sends the subscription, then applies and
// answers each response until the stream fails or ctx ends. got reports
// whether a response came.
func (c *Client) session(ctx context.Context) (got bool, err error) {
	creds := insecure.NewCredentials()
	if c.o.TLS != nil {
		creds = credentials.NewTLS(c.o.TLS())
	}
	conn, err := grpc.NewClient(c.o.Server, grpc.WithTransportCredentials(creds),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(c.o.MaxMsgSize)))
	if err != nil {
		return false, fmt.Errorf("xds: %w", err)
	}
	defer conn.Close()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	if len(c.o.Headers) > 0 {
		ctx = metadata.NewOutgoingContext(ctx, metadata.New(c.o.Headers))
	}
	stream, err := discovery.NewAggregatedDiscoveryServiceClient(conn).StreamAggregatedResources(ctx)
	if err != nil {
		return false, fmt.Errorf("xds: opening the stream: %w", err)
	}
	node, err := c.node()
	if err != nil {
		return false, err
	}
	// The version applied last: a server that still has it need not send
	// it again.
	version := c.Status().Version
	if err := stream.Send(&discovery.DiscoveryRequest{Node: node, TypeUrl: TypeURL, VersionInfo: version}); err != nil {
		return false, fmt.Errorf("xds: subscribing: %w", err)
	}
	// The response NACKed last, and how many times in a row the server
	// sent it again: go-control-plane's cache answers a NACK with the
	// version it has, the same one, at once. Each repeat is NACKed again
	// without applying it, after a backoff, so that the two do not spin;
	// the server's next version comes in answer to that NACK.
	var nacked *discovery.DiscoveryResponse
	var nackMsg string
	repeats := 0
	for {
		resp, err := stream.Recv()
		if err != nil {
			return got, fmt.Errorf("xds: %w", err)
		}
		if !got {
			got = true
			c.update(func(s *Status) { s.Connected = true })
			c.log.Info("floodgate: xDS stream open", "server", c.o.Server, "node", c.o.NodeID)
		}
		req := &discovery.DiscoveryRequest{TypeUrl: TypeURL, ResponseNonce: resp.GetNonce(), VersionInfo: version}
		switch {
		case nacked != nil && sameResponse(resp, nacked):
			wait := c.backoff(repeats)
			repeats++
			select {
			case <-ctx.Done():
				return got, ctx.Err()
			case <-c.o.After(wait):
			}
			req.ErrorDetail = &rpcstatus.Status{Code: int32(codes.InvalidArgument), Message: nackMsg}
		default:
			err := c.apply(resp)
			if err == nil {
				nacked, repeats = nil, 0
				version = resp.GetVersionInfo()
				req.VersionInfo = version
				c.update(func(s *Status) { s.Applied++; s.Version = version; s.LastError = "" })
				c.firstOnce.Do(func() { close(c.first) })
				c.log.Info("floodgate: xDS configuration applied (ACK)", "server", c.o.Server, "version", version)
				break
			}
			nacked, repeats = resp, 0
			nackMsg = err.Error()
			if len(nackMsg) > maxErrorDetail {
				nackMsg = strings.ToValidUTF8(nackMsg[:maxErrorDetail], "") + "…"
			}
			req.ErrorDetail = &rpcstatus.Status{Code: int32(codes.InvalidArgument), Message: nackMsg}
			c.update(func(s *Status) { s.Rejected++; s.LastError = nackMsg })
			c.log.Error("floodgate: xDS configuration refused (NACK); keeping the configuration in use",
				"server", c.o.Server, "version", resp.GetVersionInfo(), "error", nackMsg)
		}
		if err := stream.Send(req); err != nil {
			return got, fmt.Errorf("xds: answering version %q: %w", resp.GetVersionInfo(), err)
		}
	}
}

// sameResponse reports whether a and b hold the same version of the same
// resources.
func sameResponse(a, b *discovery.DiscoveryResponse) bool {
	if a.GetVersionInfo() != b.GetVersionInfo() || a.GetTypeUrl() != b.GetTypeUrl() || len(a.GetResources()) != len(b.GetResources()) {
		return false
	}
	for i, r := range a.GetResources() {
		if !proto.Equal(r, b.GetResources()[i]) {
			return false
		}
	}
	return true
}

// apply converts resp and hands it to Apply; the error is the NACK's.
func (c *Client) apply(resp *discovery.DiscoveryResponse) error {
	if resp.GetTypeUrl() != TypeURL {
		err := fmt.Errorf("%w: a response of type %q, not %s", ErrResource, resp.GetTypeUrl(), TypeURL)
		c.o.Apply(nil, err)
		return err
	}
	cfg, unknown, err := convert(resp.GetResources(), c.o.MergeDomains)
	if len(unknown) > 0 {
		c.log.Warn("floodgate: xDS resources have fields this version does not know; ignoring them, as envoyproxy/ratelimit does",
			"resources", unknown)
	}
	if err != nil {
		c.o.Apply(nil, err)
		return err
	}
	return c.o.Apply(cfg, nil)
}

// node is the node the client says it is.
func (c *Client) node() (*corev3.Node, error) {
	n := &corev3.Node{Id: c.o.NodeID, UserAgentName: "floodgate"}
	if len(c.o.NodeMetadata) > 0 {
		m := make(map[string]any, len(c.o.NodeMetadata))
		for k, v := range c.o.NodeMetadata {
			m[k] = v
		}
		s, err := structpb.NewStruct(m)
		if err != nil {
			return nil, fmt.Errorf("xds: node metadata: %w", err)
		}
		n.Metadata = s
	}
	return n, nil
}
