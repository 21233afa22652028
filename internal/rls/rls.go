// Package rls serves Envoy's rate limit service over gRPC:
// envoy.service.ratelimit.v3.RateLimitService, the API that Envoy's
// envoy.filters.http.ratelimit and network ratelimit filters call, and
// grpc.health.v1.Health. It is a thin layer over service.ShouldRateLimit.
package rls

import (
	"context"
	"crypto/subtle"
	"errors"
	"log/slog"
	"strings"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/floodgate/floodgate/internal/service"
)

// Server answers ShouldRateLimit and health checks.
type Server struct {
	rlsv3.UnimplementedRateLimitServiceServer
	svc    *service.Service
	log    *slog.Logger
	health *health.Server
}

// Register registers the rate limit and health services on gs. The
// health service reports SERVING for "" and for
// envoy.service.ratelimit.v3.RateLimitService until Shutdown.
func Register(gs *grpc.Server, svc *service.Service, log *slog.Logger) *Server {
	if log == nil {
		log = slog.Default()
	}
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
	resp, err := s.svc.ShouldRateLimit(ctx, req)
	switch {
	case err == nil:
		return resp, nil
	case errors.Is(err, service.ErrBadRequest):
		return nil, status.Error(codes.Unknown, err.Error())
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return nil, status.FromContextError(err).Err()
	default:
		s.log.Error("floodgate: ShouldRateLimit failed", "error", err.Error())
		return nil, status.Error(codes.Unavailable, err.Error())
	}
}

// RequireToken returns a server option that makes every rate limit call
// carry the bearer token in its "authorization" metadata, as floodgate
// serve's --token does on its other listeners; Envoy sends it with its
// grpc_service's initial_metadata. Health checks need no token. Calls
// without it get codes.Unauthenticated.
func RequireToken(token string) grpc.ServerOption {
	want := []byte("bearer " + token)
	return grpc.ChainUnaryInterceptor(func(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
		if !strings.HasPrefix(info.FullMethod, "/"+rlsv3.RateLimitService_ServiceDesc.ServiceName+"/") {
			return h(ctx, req)
		}
		md, _ := metadata.FromIncomingContext(ctx)
		for _, v := range md.Get("authorization") {
			// The scheme in any case, the token exactly, in constant time.
			if len(v) == len(want) && strings.EqualFold(v[:7], "bearer ") && subtle.ConstantTimeCompare([]byte(v[7:]), want[7:]) == 1 {
				return h(ctx, req)
			}
		}
		return nil, status.Error(codes.Unauthenticated, "floodgate: a bearer token is required (authorization metadata)")
	})
}
