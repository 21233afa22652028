// Package xds takes floodgate serve's Envoy domains from an xDS
// management server, as envoyproxy/ratelimit does with
// CONFIG_TYPE=GRPC_XDS_SOTW and as Envoy Gateway serves its rate limits:
// a state-of-the-world subscription, over the aggregated discovery
// service, to RateLimitConfig resources (TypeURL).
//
// Each response is the whole configuration. Convert turns its resources
// into a config.Config, validated as domain files are; the Client hands
// it to Options.Apply (serve's reload, which swaps it in atomically and
// keeps the store's counters), then ACKs it, or NACKs it with the reason
// as the request's error_detail and keeps what it applied last. A stream
// that fails is opened again after a backoff, bounded by
// Options.BackoffMax, with the last applied version, so that a server
// that still has it sends nothing new.
package xds
