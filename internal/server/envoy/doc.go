// Package envoy is floodgate serve's Envoy surface, in one place:
//
//   - Service decides Envoy's requests (RLS v3 ShouldRateLimit) against
//     the envoyproxy/ratelimit domains of the configuration, as
//     envoyproxy/ratelimit answers them (decide.go), with the domains
//     mapped to floodgate limits and store keys (domains.go) and
//     envoyproxy/ratelimit's per-descriptor statistics (stats.go);
//   - Register serves it over gRPC, as
//     envoy.service.ratelimit.v3.RateLimitService with grpc.health.v1,
//     within the connection limits of ServerOptions (grpc.go, limits.go);
//   - JSONHandler serves it as envoyproxy/ratelimit's POST /json (json.go).
//
// It builds on package service, whose store, metrics and reloads it
// shares: New makes both, so that a reload prepares the rules and the
// domains together. The domain files themselves are read by package
// config, with the rules they may share a directory with: the parser is
// one, and config cannot import this package (it imports service, which
// imports config).
package envoy
