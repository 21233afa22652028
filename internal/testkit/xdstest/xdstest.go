// Package xdstest runs go-control-plane's own xDS management server (its
// state-of-the-world server over a snapshot cache) on a loopback port, as
// Envoy Gateway runs one for its rate limit service, for the tests of
// floodgate's xDS client. It records the requests that clients send, so
// that a test can see their ACKs and NACKs.
package xdstest

import (
	"context"
	"crypto/tls"
	"net"
	"sync"
	"testing"
	"time"

	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	cachev3 "github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	serverv3 "github.com/envoyproxy/go-control-plane/pkg/server/v3"
	rlsconf "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
)

// Server is a running management server.
type Server struct {
	t     testing.TB
	cache cachev3.SnapshotCache
	// Addr is its address, host:port.
	Addr string
	// watched is the node whose requests are recorded: "" every node's.
	watched string
	tls     *tls.Config

	mu       sync.Mutex
	gs       *grpc.Server
	done     chan struct{}
	cancel   context.CancelFunc
	requests chan *discovery.DiscoveryRequest
	nacks    map[string]int // NACKs by node
}

// Options configure Start. The zero value records every node's requests,
// in plain text.
type Options struct {
	// Node, when set, is the node whose requests are recorded; others'
	// are dropped (envoyproxy/ratelimit repeats its NACKs at once).
	// Without it, every request is recorded, and more than the test reads
	// fail it.
	Node string
	// TLS, when set, serves TLS with it.
	TLS *tls.Config
}

// Start starts a management server on a free loopback port, stopped when
// t ends.
func Start(t testing.TB, o Options) *Server {
	t.Helper()
	s := &Server{t: t, cache: cachev3.NewSnapshotCache(false, cachev3.IDHash{}, nil), requests: make(chan *discovery.DiscoveryRequest, 64),
		watched: o.Node, tls: o.TLS, nacks: map[string]int{}}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s.Addr = ln.Addr().String()
	s.serve(ln)
	t.Cleanup(s.Stop)
	return s
}

func (s *Server) serve(ln net.Listener) {
	ctx, cancel := context.WithCancel(context.Background())
	srv := serverv3.NewServer(ctx, s.cache, serverv3.CallbackFuncs{
		StreamRequestFunc: func(_ int64, req *discovery.DiscoveryRequest) error {
			if req.GetErrorDetail() != nil {
				s.mu.Lock()
				s.nacks[req.GetNode().GetId()]++
				s.mu.Unlock()
			}
			if s.watched != "" && req.GetNode().GetId() != s.watched {
				return nil
			}
			select {
			case s.requests <- req:
			default:
				if s.watched == "" {
					s.t.Errorf("xdstest: more requests than the test reads")
				} // else a NACK repeated while the test looks elsewhere
			}
			return nil
		},
	})
	var opts []grpc.ServerOption
	if s.tls != nil {
		opts = append(opts, grpc.Creds(credentials.NewTLS(s.tls)))
	}
	gs := grpc.NewServer(opts...)
	discovery.RegisterAggregatedDiscoveryServiceServer(gs, srv)
	done := make(chan struct{})
	go func() {
		defer close(done)
		gs.Serve(ln)
	}()
	s.mu.Lock()
	s.gs, s.done, s.cancel = gs, done, cancel
	s.mu.Unlock()
}

// Stop stops the server and closes its streams: the server is gone.
func (s *Server) Stop() {
	s.mu.Lock()
	gs, done, cancel := s.gs, s.done, s.cancel
	s.gs = nil
	s.mu.Unlock()
	if gs == nil {
		return
	}
	cancel()
	gs.Stop()
	<-done
}

// Restart serves again on the same address, with the same snapshots.
func (s *Server) Restart() {
	s.t.Helper()
	ln, err := net.Listen("tcp", s.Addr)
	if err != nil {
		s.t.Fatal(err)
	}
	s.serve(ln)
}

// Set makes version, of configs, the snapshot of node.
func (s *Server) Set(node, version string, configs ...*rlsconf.RateLimitConfig) {
	s.t.Helper()
	rs := make([]types.Resource, len(configs))
	for i, c := range configs {
		rs[i] = c
	}
	snap, err := cachev3.NewSnapshot(version, map[resource.Type][]types.Resource{resource.RateLimitConfigType: rs})
	if err != nil {
		s.t.Fatal(err)
	}
	if err := s.cache.SetSnapshot(context.Background(), node, snap); err != nil {
		s.t.Fatal(err)
	}
}

// NACKs returns how many NACKs node has sent, on every stream.
func (s *Server) NACKs(node string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.nacks[node]
}

// Answer waits at most 10s for a client's next request that answers a
// response (an ACK or a NACK: its nonce is set), skipping subscriptions.
func (s *Server) Answer() *discovery.DiscoveryRequest {
	s.t.Helper()
	return s.next(func(r *discovery.DiscoveryRequest) bool { return r.GetResponseNonce() != "" }, "answer")
}

// Subscription waits at most 10s for a client's next request that opens
// a stream (no nonce).
func (s *Server) Subscription() *discovery.DiscoveryRequest {
	s.t.Helper()
	return s.next(func(r *discovery.DiscoveryRequest) bool { return r.GetResponseNonce() == "" }, "subscription")
}

// NACK waits at most 10s for a client's next NACK.
func (s *Server) NACK() *discovery.DiscoveryRequest {
	s.t.Helper()
	return s.next(func(r *discovery.DiscoveryRequest) bool { return r.GetErrorDetail() != nil }, "NACK")
}

func (s *Server) next(match func(*discovery.DiscoveryRequest) bool, what string) *discovery.DiscoveryRequest {
	s.t.Helper()
	timeout := time.After(10 * time.Second)
	for {
		select {
		case req := <-s.requests:
			if match(req) {
				return req
			}
		case <-timeout:
			s.t.Fatalf("xdstest: no %s from a client within 10s", what)
			return nil
		}
	}
}
