package xds_test

import (
	"context"
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
)

// mgmt is go-control-plane's own xDS management server (its SotW server
// over a snapshot cache), on a loopback port, as Envoy Gateway runs one
// for its rate limit service.
type mgmt struct {
	t     *testing.T
	cache cachev3.SnapshotCache
	addr  string

	mu       sync.Mutex
	gs       *grpc.Server
	done     chan struct{}
	cancel   context.CancelFunc
	requests chan *discovery.DiscoveryRequest // every request of a watched node
	// watched is the node whose requests go to requests: "" every node's.
	// Another node's are dropped (envoyproxy/ratelimit's NACKs repeat).
	watched string
}

// startMgmt starts a management server on a free loopback port; stop
// and restart stop it and start it again on the same port with the same
// snapshots. It is stopped when t ends.
func startMgmt(t *testing.T) *mgmt { return startMgmtFor(t, "") }

// startMgmtFor is startMgmt whose requests channel has the requests of
// node alone ("": of every node).
func startMgmtFor(t *testing.T, node string) *mgmt {
	t.Helper()
	m := &mgmt{t: t, cache: cachev3.NewSnapshotCache(false, cachev3.IDHash{}, nil), requests: make(chan *discovery.DiscoveryRequest, 64), watched: node}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	m.addr = ln.Addr().String()
	m.serve(ln)
	t.Cleanup(m.stop)
	return m
}

func (m *mgmt) serve(ln net.Listener) {
	ctx, cancel := context.WithCancel(context.Background())
	srv := serverv3.NewServer(ctx, m.cache, serverv3.CallbackFuncs{
		StreamRequestFunc: func(_ int64, req *discovery.DiscoveryRequest) error {
			if m.watched != "" && req.GetNode().GetId() != m.watched {
				return nil
			}
			select {
			case m.requests <- req:
			default:
				if m.watched == "" {
					m.t.Errorf("more requests than the test reads")
				} // else a NACK repeated while the test looks elsewhere
			}
			return nil
		},
	})
	gs := grpc.NewServer()
	discovery.RegisterAggregatedDiscoveryServiceServer(gs, srv)
	done := make(chan struct{})
	go func() {
		defer close(done)
		gs.Serve(ln)
	}()
	m.mu.Lock()
	m.gs, m.done, m.cancel = gs, done, cancel
	m.mu.Unlock()
}

// stop stops the server and closes its streams: the server is gone.
func (m *mgmt) stop() {
	m.mu.Lock()
	gs, done, cancel := m.gs, m.done, m.cancel
	m.gs = nil
	m.mu.Unlock()
	if gs == nil {
		return
	}
	cancel()
	gs.Stop()
	<-done
}

// restart serves again on the same address.
func (m *mgmt) restart() {
	m.t.Helper()
	ln, err := net.Listen("tcp", m.addr)
	if err != nil {
		m.t.Fatal(err)
	}
	m.serve(ln)
}

// set makes version, of configs, the snapshot of node.
func (m *mgmt) set(node, version string, configs ...*rlsconf.RateLimitConfig) {
	m.t.Helper()
	rs := make([]types.Resource, len(configs))
	for i, c := range configs {
		rs[i] = c
	}
	snap, err := cachev3.NewSnapshot(version, map[resource.Type][]types.Resource{resource.RateLimitConfigType: rs})
	if err != nil {
		m.t.Fatal(err)
	}
	if err := m.cache.SetSnapshot(context.Background(), node, snap); err != nil {
		m.t.Fatal(err)
	}
}

// request waits for the client's next request that answers a response
// (its nonce is set), skipping subscriptions.
func (m *mgmt) answer() *discovery.DiscoveryRequest {
	m.t.Helper()
	timeout := time.After(10 * time.Second)
	for {
		select {
		case req := <-m.requests:
			if req.GetResponseNonce() != "" {
				return req
			}
		case <-timeout:
			m.t.Fatal("no answer from the client within 10s")
			return nil
		}
	}
}

// subscription waits for the client's next request that opens a stream.
func (m *mgmt) subscription() *discovery.DiscoveryRequest {
	m.t.Helper()
	timeout := time.After(10 * time.Second)
	for {
		select {
		case req := <-m.requests:
			if req.GetResponseNonce() == "" {
				return req
			}
		case <-timeout:
			m.t.Fatal("no subscription from the client within 10s")
			return nil
		}
	}
}
