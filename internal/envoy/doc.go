// Package envoy is floodgate serve's Envoy surface, in one place: Envoy's
// rate limit service (envoy.service.ratelimit.v3.RateLimitService, which
// Envoy's http and network ratelimit filters call) with grpc.health.v1
// over gRPC, and the gRPC server's limits.
//
// The domain files themselves are read by package config, with the rules
// file they may share a directory with.
package envoy
