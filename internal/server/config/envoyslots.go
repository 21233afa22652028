package config

import (
	"go.yaml.in/yaml/v3"
)

// floodgate's extension of envoyproxy/ratelimit's domain files: a
// descriptor may be a concurrency limit instead of a rate limit.
//
//	domain: api
//	descriptors:
//	  - key: api_key
//	    concurrency: {slots: 5, lease: 60s}
//
// Envoy's call at a request's start acquires a slot on the descriptor's
// key; its call when the stream is done (apply_on_stream_done), whose
// descriptor carries the entry EnvoyReleaseKey, releases it. The two
// calls name one permit by the value of the entry EnvoyPermitKey, the
// same in both (Envoy's x-request-id, through a request_headers action).
// These two entries are floodgate's: they are taken out of the
// descriptor before it is matched.
const (
	// EnvoyPermitKey is the key of the descriptor entry whose value names
	// the request's permit in both calls.
	EnvoyPermitKey = "floodgate_permit"
	// EnvoyReleaseKey is the key of the descriptor entry that marks the
	// stream-done call, which releases.
	EnvoyReleaseKey = "floodgate_release"
)

// envoySlots reads a descriptor's concurrency field.
func (p *parser) envoySlots(n *yaml.Node, path string) *Slots {
	f := p.fields(n, path, "slots", "lease")
	s := &Slots{Name: path}
	p.slotsAndLease(s, n, f, path, "no stream-done call releases it")
	return s
}

// LookupSlots returns the concurrency descriptor that a request's
// descriptor (without floodgate's entries) names, or nil: its entries
// match children by key and value, then by wildcard, then by key, and the
// last one's node has a concurrency limit.
func (d *Domain) LookupSlots(entries []Entry) *Descriptor {
	if !d.HasConcurrency {
		return nil
	}
	node := &d.Root
	for i, e := range entries {
		name := e.Key + "_" + e.Value
		next := node.Children[name]
		if next == nil {
			for _, w := range node.Wildcards {
				if w.Match(name) {
					next = node.Children[w.Name]
					break
				}
			}
		}
		if next == nil {
			next = node.Children[e.Key]
		}
		if next == nil {
			return nil
		}
		if i == len(entries)-1 && next.Concurrency != nil {
			return next
		}
		node = next
	}
	return nil
}

// hasSlots reports whether a descriptor of the tree under n is a
// concurrency limit.
func hasSlots(n *Descriptor) bool {
	if n.Concurrency != nil {
		return true
	}
	for _, c := range n.Children {
		if hasSlots(c) {
			return true
		}
	}
	return false
}
