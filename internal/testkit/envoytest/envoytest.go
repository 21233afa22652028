// Package envoytest builds the Envoy rate limit requests that tests send
// to floodgate, over gRPC or POST /json, so that each test says which
// entries it sends rather than how the protobuf messages nest, and dials
// the gRPC service they go to.
package envoytest

import (
	"fmt"
	"testing"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

// Descriptor is a descriptor of the entries kv, given as key, value, key,
// value and so on. An odd count is a mistake in the test: it panics
// rather than drop the last key.
func Descriptor(kv ...string) *rlcommon.RateLimitDescriptor {
	if len(kv)%2 != 0 {
		panic(fmt.Sprintf("envoytest.Descriptor: %d strings, want key and value pairs", len(kv)))
	}
	d := &rlcommon.RateLimitDescriptor{Entries: make([]*rlcommon.RateLimitDescriptor_Entry, 0, len(kv)/2)}
	for i := 0; i < len(kv); i += 2 {
		d.Entries = append(d.Entries, &rlcommon.RateLimitDescriptor_Entry{Key: kv[i], Value: kv[i+1]})
	}
	return d
}

// Request is a request in domain of the descriptors ds, in order.
func Request(domain string, ds ...*rlcommon.RateLimitDescriptor) *rlsv3.RateLimitRequest {
	return &rlsv3.RateLimitRequest{Domain: domain, Descriptors: ds}
}

// Dial returns a plain-text gRPC client connection to addr (a test's
// loopback server), closed when t ends.
func Dial(t testing.TB, addr string) *grpc.ClientConn {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

// Client returns a client of the rate limit service at addr, on a Dial
// connection.
func Client(t testing.TB, addr string) rlsv3.RateLimitServiceClient {
	t.Helper()
	return rlsv3.NewRateLimitServiceClient(Dial(t, addr))
}
