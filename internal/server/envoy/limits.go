package envoy

import (
	"context"
	"crypto/subtle"
	"fmt"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/tap"
)

// The defaults of Limits.
const (
	// DefaultMaxStreams is RFC 9113's recommended floor; Envoy opens
	// another connection when one has this many calls in flight.
	DefaultMaxStreams = 100
	// DefaultMaxMsgSize holds four times Envoy's default limit on a
	// request's headers (60 KiB), where descriptor values come from.
	DefaultMaxMsgSize = 256 << 10
	// DefaultHandshakeTimeout bounds TLS and the HTTP/2 preface.
	DefaultHandshakeTimeout = 10 * time.Second
	// DefaultIdleTimeout closes connections without calls.
	DefaultIdleTimeout = 5 * time.Minute
)

// Transport sizes that no operator needs to change: they bound memory
// per connection and stream, far above what rate limit calls use.
const (
	// streamWindow is each stream's HTTP/2 receive window, in bytes. gRPC
	// widens it to the size of a message being read, up to MaxMsgSize, so
	// it only bounds what a stream can send beyond its one request.
	streamWindow = 64 << 10
	// connWindow is the connection's receive window, in bytes. Fixed
	// windows also turn off gRPC's bandwidth-delay estimation, a ping per
	// round trip on every connection that Envoy's small messages never need.
	connWindow = 1 << 20
	// maxHeaderList bounds a call's metadata, in bytes, as the HTTP
	// listener's MaxHeaderBytes does; gRPC's default is 16 MiB per stream.
	maxHeaderList = 64 << 10
	// bufferSize is each connection's read buffer and (shared, released
	// after each flush: gRPC's default) write buffer, in bytes.
	bufferSize = 16 << 10
	// workers serve streams on goroutines that keep their grown stacks: a
	// new goroutine per request spent about a seventh of the service's CPU
	// growing its stack. A stream finding them all busy gets its own.
	workers = 256
	// keepaliveTime and keepaliveTimeout find dead peers: a ping after a
	// minute without frames, and the connection closed if not answered.
	keepaliveTime    = time.Minute
	keepaliveTimeout = 20 * time.Second
	// minPingInterval is the shortest interval between a client's pings
	// that the server accepts (with or without calls in flight); a client
	// pinging faster is sent GOAWAY.
	minPingInterval = 10 * time.Second
)

// Limits bound what one client can make the gRPC server hold. Memory
// per connection is at most about MaxStreams × MaxMsgSize (a call's
// request being read) plus fixed buffers; the number of connections is
// the listener's to bound. Zero fields take the defaults.
type Limits struct {
	// MaxStreams is the most calls in flight on one connection; more are
	// refused (REFUSED_STREAM) without being read. Default:
	// DefaultMaxStreams.
	MaxStreams uint32
	// MaxMsgSize is the largest request message, in bytes; a larger one
	// is answered codes.ResourceExhausted before its body is buffered.
	// Default: DefaultMaxMsgSize.
	MaxMsgSize int
	// HandshakeTimeout is how long a new connection has to finish TLS and
	// send the HTTP/2 preface and settings before it is closed. Default:
	// DefaultHandshakeTimeout.
	HandshakeTimeout time.Duration
	// IdleTimeout closes (GOAWAY) a connection with no call in flight for
	// this long; the client reconnects when it next calls. Default:
	// DefaultIdleTimeout.
	IdleTimeout time.Duration
	// Token, when not empty, is the bearer token every call but health
	// checks must carry in its "authorization" metadata (see RequireToken).
	Token string
}

// ServerOptions returns the gRPC server options that enforce l, with
// the transport's fixed sizes. It fails on negative limits.
func ServerOptions(l Limits) ([]grpc.ServerOption, error) {
	if l.MaxStreams == 0 {
		l.MaxStreams = DefaultMaxStreams
	}
	if l.MaxMsgSize == 0 {
		l.MaxMsgSize = DefaultMaxMsgSize
	}
	if l.HandshakeTimeout == 0 {
		l.HandshakeTimeout = DefaultHandshakeTimeout
	}
	if l.IdleTimeout == 0 {
		l.IdleTimeout = DefaultIdleTimeout
	}
	switch {
	case l.MaxMsgSize < 0:
		return nil, fmt.Errorf("rls: MaxMsgSize must not be negative, got %d", l.MaxMsgSize)
	case l.HandshakeTimeout < 0:
		return nil, fmt.Errorf("rls: HandshakeTimeout must not be negative, got %s", l.HandshakeTimeout)
	case l.IdleTimeout < 0:
		return nil, fmt.Errorf("rls: IdleTimeout must not be negative, got %s", l.IdleTimeout)
	}
	opts := []grpc.ServerOption{
		grpc.MaxConcurrentStreams(l.MaxStreams),
		grpc.MaxRecvMsgSize(l.MaxMsgSize),
		grpc.InitialWindowSize(streamWindow),
		grpc.InitialConnWindowSize(connWindow),
		grpc.MaxHeaderListSize(maxHeaderList),
		grpc.ReadBufferSize(bufferSize),
		grpc.WriteBufferSize(bufferSize),
		grpc.NumStreamWorkers(workers),
		grpc.ConnectionTimeout(l.HandshakeTimeout),
		grpc.KeepaliveParams(keepalive.ServerParameters{
			MaxConnectionIdle: l.IdleTimeout,
			Time:              keepaliveTime,
			Timeout:           keepaliveTimeout,
		}),
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: minPingInterval, PermitWithoutStream: true}),
	}
	if l.Token != "" {
		opts = append(opts, RequireToken(l.Token))
	}
	return opts, nil
}

// RequireToken returns a server option that makes every call but health
// checks carry the bearer token in its "authorization" metadata, as
// floodgate serve's --token does on its other listeners; Envoy sends it
// with its grpc_service's initial_metadata. Calls without it get
// codes.Unauthenticated. The token is checked on the call's headers,
// before its message is read: an unauthenticated client cannot make the
// server buffer request bodies. Health checks without the token are
// served, at most maxOpenHealth at a time on one connection (more get
// codes.ResourceExhausted): each may have its message buffered, up to
// the size limit. It sets the server's InTapHandle, of which gRPC allows
// one.
func RequireToken(token string) grpc.ServerOption {
	want := []byte("bearer " + token)
	health := "/" + healthpb.Health_ServiceDesc.ServiceName + "/"
	open := &openCalls{n: map[string]int{}}
	return grpc.InTapHandle(func(ctx context.Context, info *tap.Info) (context.Context, error) {
		for _, v := range info.Header.Get("authorization") {
			// The scheme in any case, the token exactly, in constant time.
			if len(v) == len(want) && strings.EqualFold(v[:7], "bearer ") && subtle.ConstantTimeCompare([]byte(v[7:]), want[7:]) == 1 {
				return ctx, nil
			}
		}
		if !strings.HasPrefix(info.FullMethodName, health) {
			return nil, status.Error(codes.Unauthenticated, "floodgate: a bearer token is required (authorization metadata)")
		}
		if !open.enter(ctx) {
			return nil, status.Errorf(codes.ResourceExhausted, "floodgate: more than %d health checks without a token in flight on this connection", maxOpenHealth)
		}
		return ctx, nil
	})
}

// maxOpenHealth is the most health checks without the token in flight
// on one connection: probes send one at a time.
const maxOpenHealth = 8

// openCalls counts calls in flight by connection.
type openCalls struct {
	mu sync.Mutex
	n  map[string]int // by the connection's remote address; no zeros
}

// enter counts the call of stream context ctx until ctx ends, which gRPC
// makes it do when the stream ends however it ends, or reports false if
// its connection already has maxOpenHealth.
func (o *openCalls) enter(ctx context.Context) bool {
	var conn string // calls without a peer, if any, share one count
	if p, ok := peer.FromContext(ctx); ok && p.Addr != nil {
		conn = p.Addr.String()
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.n[conn] >= maxOpenHealth {
		return false
	}
	o.n[conn]++
	context.AfterFunc(ctx, func() {
		o.mu.Lock()
		defer o.mu.Unlock()
		if o.n[conn]--; o.n[conn] == 0 {
			delete(o.n, conn)
		}
	})
	return true
}
