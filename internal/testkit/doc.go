// Package testkit holds nothing itself: its subdirectories are for tests
// (and bench's tools) only, never imported by code that ships:
//
//	redistest  real redis-server processes (standalone or cluster) on free ports
//	peertest   envoyproxy/ratelimit, built and started for differential tests
//	envoytest  Envoy rate limit requests, built from their entries, and a client
//	tlstest    a CA, server and client certificates as PEM files
//	nettest    helpers for tests of network servers
//	syncbuf    a locked buffer for a process's output
//	servetest  a floodgate serve process, and where its banner says it listens
//	xdstest    go-control-plane's xDS management server, for the xDS client
package testkit
