package envoy

import (
	"context"
	"errors"
	"log/slog"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	"github.com/floodgate/floodgate"
	"github.com/floodgate/floodgate/internal/lib/lograte"
	"github.com/floodgate/floodgate/internal/server/service"
)

// Server answers ShouldRateLimit and health checks.
type Server struct {
	rlsv3.UnimplementedRateLimitServiceServer
	svc    *Service
	log    *slog.Logger
	health *health.Server
}

// Register registers the rate limit and health services on gs, logging
// store failures to log (default slog.Default()) a line a second at most,
// with the count held back. The
// health service reports SERVING for "" and for
// envoy.service.ratelimit.v3.RateLimitService until Shutdown.
func Register(gs *grpc.Server, svc *Service, log *slog.Logger) *Server {
	if log == nil {
		log = slog.Default()
	}
	// A failing store fails every call: a line a second, with the count.
	log = slog.New(lograte.NewHandler(log.Handler(), time.Second, nil))
	s := &Server{svc: svc, log: log, health: health.NewServer()}
	rlsv3.RegisterRateLimitServiceServer(gs, s)
	healthpb.RegisterHealthServer(gs, s.health)
	s.health.SetServingStatus("", healthpb.HealthCheckResponse_SERVING)
	s.health.SetServingStatus(rlsv3.RateLimitService_ServiceDesc.ServiceName, healthpb.HealthCheckResponse_SERVING)
	return s
}

// Shutdown makes health checks answer NOT_SERVING, so that clients move
// away before the server stops.
func (s *Server) Shutdown() { s.health.Shutdown() }

// ShouldRateLimit decides a request. Bad input (an empty domain, no
// descriptors) gets codes.Unknown with envoyproxy/ratelimit's message, as
// that one answers; a failing store codes.Unavailable.
func (s *Server) ShouldRateLimit(ctx context.Context, req *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
	sd := &s.svc.sd
	if sd.totalRequests != nil {
		defer sd.call(time.Now())
	}
	resp, err := s.svc.ShouldRateLimit(ctx, req)
	switch {
	case err == nil:
		return resp, nil
	case errors.Is(err, service.ErrBadRequest):
		sd.serviceError.Add(1)
		return nil, status.Error(codes.Unknown, err.Error())
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return nil, status.FromContextError(err).Err()
	case errors.Is(err, floodgate.ErrKey):
		// One descriptor's key fails on its own; the service counts and
		// logs it, a line a second at most.
		return nil, status.Error(codes.Internal, err.Error())
	default:
		sd.redisError.Add(1)
		s.log.Error("floodgate: ShouldRateLimit failed", "error", err.Error())
		return nil, status.Error(codes.Unavailable, err.Error())
	}
}
