package grpclimit_test

import (
	"context"
	"testing"
	"time"

	"github.com/floodgate/floodgate"
	"github.com/floodgate/floodgate/grpclimit"
	"github.com/floodgate/floodgate/storetest"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
)

// One slot per peer: a Watch stream holds it while it is open; a second
// stream, or a unary call, meanwhile fails with ResourceExhausted and
// the retry-after of the stream's permit; once the stream ends, the slot
// is free again.
func TestConcurrencyInterceptors(t *testing.T) {
	clock := storetest.NewClock(storetest.Base)
	st := floodgate.NewMemoryStore(&floodgate.MemoryOptions{Clock: clock, SweepInterval: -1})
	t.Cleanup(func() { st.Close() })
	c, err := floodgate.NewConcurrency(st, 1, 20*time.Second, &floodgate.ConcurrencyOptions{Name: "streams"})
	if err != nil {
		t.Fatal(err)
	}
	opts := &grpclimit.ConcurrencyOptions{ExtendEvery: -1}
	// ended hears of each stream once the interceptor has released its
	// slot.
	ended := make(chan error, 4)
	signal := func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
		err := handler(srv, ss)
		ended <- err
		return err
	}
	client := serve(t, []grpc.ServerOption{
		grpc.UnaryInterceptor(grpclimit.UnaryConcurrencyInterceptor(c, opts)),
		grpc.ChainStreamInterceptor(signal, grpclimit.StreamConcurrencyInterceptor(c, opts)),
	})
	ctx := context.Background()
	for range 2 { // unary calls release their slot as they return
		if _, err := client.Check(ctx, &healthpb.HealthCheckRequest{}); err != nil {
			t.Fatal(err)
		}
	}
	sctx, cancel := context.WithCancel(ctx)
	stream, err := client.Watch(sctx, &healthpb.HealthCheckRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := stream.Recv(); err != nil {
		t.Fatal(err)
	}
	clock.Advance(5 * time.Second)
	var hdr metadata.MD
	_, err = client.Check(ctx, &healthpb.HealthCheckRequest{}, grpc.Header(&hdr))
	if status.Code(err) != codes.ResourceExhausted || first(hdr, grpclimit.MDRetryAfter) != "15" {
		t.Fatalf("call while the stream holds the slot: %v, %v", err, hdr)
	}
	retry, quota := details(err)
	if retry == nil || retry.RetryDelay.AsDuration() != 15*time.Second || quota == nil || quota.Violations[0].Description != "streams" {
		t.Fatalf("details: %v %v", retry, quota)
	}
	s2, err := client.Watch(ctx, &healthpb.HealthCheckRequest{})
	if err == nil {
		_, err = s2.Recv()
	}
	if status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("second stream: %v", err)
	}
	<-ended // the second stream's, denied
	cancel()
	<-ended // the first stream's: its slot is released
	if _, err := client.Check(ctx, &healthpb.HealthCheckRequest{}); err != nil {
		t.Fatalf("after the stream ended: %v", err)
	}
}
