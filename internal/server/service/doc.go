// Package service is the core of floodgate serve: it decides requests
// against the configured rules over one store, swaps in new rules
// atomically, and counts what it does. The HTTP and RESP servers are thin
// layers over it, and package envoy decides Envoy's requests with its
// store, counters and configuration (see Options.Prepare).
package service
