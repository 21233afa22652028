package grpclimit_test

import (
	"time"

	"github.com/floodgate/floodgate"
	"github.com/floodgate/floodgate/grpclimit"
	"google.golang.org/grpc"
)

// A gRPC server that allows each API key (or, without one, each peer IP)
// 100 calls per second, with bursts of 200.
func ExampleUnaryServerInterceptor() {
	lim, _ := floodgate.New(floodgate.TokenBucket(100, time.Second, 200).Named("api"))
	opts := &grpclimit.Options{Key: grpclimit.Metadata("x-api-key", grpclimit.PeerIP())}
	srv := grpc.NewServer(
		grpc.UnaryInterceptor(grpclimit.UnaryServerInterceptor(lim, opts)),
		grpc.StreamInterceptor(grpclimit.StreamServerInterceptor(lim, opts)),
	)
	_ = srv // register services, then srv.Serve(listener)
}

// A client that keeps itself under 10 calls per second per method,
// waiting for capacity instead of being denied.
func ExampleUnaryClientInterceptor() {
	lim, _ := floodgate.New(floodgate.PerSecond(10))
	_ = grpc.WithUnaryInterceptor(grpclimit.UnaryClientInterceptor(lim, &grpclimit.ClientOptions{Key: grpclimit.ByMethod()}))
}
