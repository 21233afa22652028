// Package server holds nothing itself: its subdirectories are the parts
// of floodgate serve, which cmd/floodgate puts together:
//
//	config   the rules file and Envoy's domain files
//	service  the rules' decisions over one store, reloads, metrics
//	httpapi  the HTTP/JSON API, health and metrics endpoints
//	resp     the Redis protocol (CL.THROTTLE, FG.*)
//	envoy    Envoy's rate limit service: decisions, gRPC, POST /json
//	metrics  counters and histograms in the Prometheus text format
//	dash     the live dashboard at /ui/
//	tlsconf  TLS and mutual TLS from reloadable certificate files
//	statsd   envoyproxy/ratelimit's statistics over StatsD
//	xds      Envoy's domains from an xDS management server
//	tracing  OpenTelemetry server spans from the caller's traceparent
//
// Each surface (httpapi, resp, envoy) is a layer over service.
package server
