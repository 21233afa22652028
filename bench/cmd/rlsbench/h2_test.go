package main

import (
	"context"
	"math"
	"net"
	"testing"
	"time"

	rls "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
)

// answers is a RateLimitService for the load generators' test: over the
// limit for requests of three descriptors, within it for one, and never
// answering in time when slow is set.
type answers struct {
	rls.UnimplementedRateLimitServiceServer
	slow bool
}

func (a *answers) ShouldRateLimit(ctx context.Context, req *rls.RateLimitRequest) (*rls.RateLimitResponse, error) {
	if a.slow {
		<-ctx.Done()
		return nil, ctx.Err()
	}
	code := rls.RateLimitResponse_OK
	if len(req.Descriptors) == 3 {
		code = rls.RateLimitResponse_OVER_LIMIT
	}
	return &rls.RateLimitResponse{OverallCode: code}, nil
}

// TestGenerators checks that both load generators read the answers alike:
// the overall code, and a call past its deadline counted, not failed.
func TestGenerators(t *testing.T) {
	for _, tc := range []struct {
		name       string
		slow       bool
		descs      int
		over, late bool
	}{
		{name: "within", descs: 1},
		{name: "over", descs: 3, over: true},
		{name: "past the deadline", slow: true, descs: 1, late: true},
	} {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		srv := grpc.NewServer()
		rls.RegisterRateLimitServiceServer(srv, &answers{slow: tc.slow})
		go srv.Serve(ln)
		for name, run := range generators {
			r := run(ln.Addr().String(), 4, tc.descs, 100*time.Millisecond)
			// A call the server answers at once may still miss Envoy's
			// 20ms deadline on a loaded machine: it is counted late, and
			// not read, so the answers in time are what must read alike.
			overN := int(math.Round(r.over * float64(r.n)))
			inTime := r.n - r.timedOut
			switch {
			case r.n == 0:
				t.Errorf("%s, %s: no answers", tc.name, name)
			case tc.late && r.timedOut != r.n:
				t.Errorf("%s, %s: %d of %d calls past the deadline, want all", tc.name, name, r.timedOut, r.n)
			case !tc.late && 2*r.timedOut > r.n:
				t.Errorf("%s, %s: %d of %d calls past the deadline, want most in time", tc.name, name, r.timedOut, r.n)
			case !tc.late && tc.over && overN != inTime:
				t.Errorf("%s, %s: %d of %d answers in time over the limit, want all", tc.name, name, overN, inTime)
			case !tc.late && !tc.over && overN != 0:
				t.Errorf("%s, %s: %d of %d answers in time over the limit, want none", tc.name, name, overN, inTime)
			}
			if r.timedOut > 0 && !tc.late {
				t.Logf("%s, %s: %d of %d calls past the deadline", tc.name, name, r.timedOut, r.n)
			}
		}
		srv.Stop()
	}
}

// TestOverallCode checks the reader of RateLimitResponse.overall_code on
// messages as protobuf writes them, and refuses what is not one message.
func TestOverallCode(t *testing.T) {
	for _, tc := range []struct {
		name string
		resp *rls.RateLimitResponse
		want rls.RateLimitResponse_Code
	}{
		{"ok", &rls.RateLimitResponse{OverallCode: rls.RateLimitResponse_OK}, rls.RateLimitResponse_OK},
		{"over, after statuses", &rls.RateLimitResponse{OverallCode: rls.RateLimitResponse_OVER_LIMIT,
			Statuses: []*rls.RateLimitResponse_DescriptorStatus{{Code: rls.RateLimitResponse_OK, LimitRemaining: 7}}}, rls.RateLimitResponse_OVER_LIMIT},
		{"unknown, left out", &rls.RateLimitResponse{}, rls.RateLimitResponse_UNKNOWN},
	} {
		msg := grpcFrame(tc.resp)
		if got, ok := overallCode(msg); !ok || got != tc.want {
			t.Errorf("%s: overallCode = %v, %v; want %v, true", tc.name, got, ok, tc.want)
		}
		if _, ok := overallCode(msg[:len(msg)-1]); ok {
			t.Errorf("%s: a message cut short was read", tc.name)
		}
	}
}
