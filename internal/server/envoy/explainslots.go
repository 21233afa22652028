package envoy

import (
	"context"
	"errors"
	"fmt"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"

	"github.com/floodgate/floodgate/core"
	"github.com/floodgate/floodgate/core/slot"
	"github.com/floodgate/floodgate/internal/lib/arith"
)

// ExplainSlots is a concurrency descriptor's slots on its key, in a
// DescriptorExplanation. Times are milliseconds, rounded up.
type ExplainSlots struct {
	// Slots is N, the most permits held at once; LeaseMs how long one
	// lives unless released or extended.
	Slots   int64 `json:"slots"`
	LeaseMs int64 `json:"lease_ms"`
	// Held is how many permits are live now.
	Held int64 `json:"held"`
	// FreeInMs is the time until the earliest live permit expires: when a
	// slot frees at the latest; null when none is held.
	FreeInMs *int64 `json:"free_in_ms"`
	// Release reports that the descriptor carries the release marker: it
	// is the stream-done call, which gives a permit back.
	Release bool `json:"release,omitempty"`
	// Source is who answers: "store", or a fallback's mode.
	Source string `json:"source"`
}

// explainSlots explains d when it is a concurrency descriptor of dom,
// and reports whether it was one.
func (s *Service) explainSlots(ctx context.Context, domain string, dom *envoyDomain, d *rlcommon.RateLimitDescriptor, de *DescriptorExplanation) (bool, error) {
	es, pb, _, release := slotEntries(d.GetEntries())
	node := dom.cfg.LookupSlots(es)
	if node == nil {
		return false, nil
	}
	p, spec, err := s.slotPolicy(node.Concurrency)
	if err != nil {
		return true, err
	}
	si, ok := p.(slot.Inspector)
	if !ok {
		return true, fmt.Errorf("envoy: the store cannot inspect a key's slots: %w", errors.ErrUnsupported)
	}
	in, err := si.InspectSlots(ctx, slotKey(domain, pb))
	if err != nil {
		s.svc.KeyFailed("envoy", err)
		return true, err
	}
	c := &ExplainSlots{Slots: spec.Slots, LeaseMs: arith.RoundUp(time.Duration(spec.Lease)*time.Microsecond, time.Millisecond), Held: in.Held, Release: release, Source: in.Source.String()}
	if in.Source == core.SourceLocal && in.Fallback != nil {
		if sh, err := spec.Share(max(1, in.Fallback.Instances)); err == nil {
			c.Slots = sh.Slots
		}
	}
	if in.Held > 0 {
		ms := arith.RoundUp(time.Duration(max(0, in.Earliest-in.Now))*time.Microsecond, time.Millisecond)
		c.FreeInMs = &ms
	}
	de.Concurrency, de.Descriptor, de.Code = c, node.Path, "OK"
	de.Why = append(de.Why, fmt.Sprintf("it is a concurrency descriptor (%s): %d slots, each permit held until the stream-done call releases it, or for a lease of %s", node.Path, c.Slots, time.Duration(c.LeaseMs)*time.Millisecond))
	held := fmt.Sprintf("%d of %d slots are held now", c.Held, c.Slots)
	if c.FreeInMs != nil {
		held += fmt.Sprintf("; the earliest permit expires in %s: a slot frees then at the latest", time.Duration(*c.FreeInMs)*time.Millisecond)
	}
	de.Why = append(de.Why, held)
	switch {
	case release:
		de.Why = append(de.Why, "it carries the release marker: the call releases the permit it names, and is never over the limit")
	case c.Held >= c.Slots || in.Source == core.SourceFailClosed:
		de.Code = "OVER_LIMIT"
		de.Why = append(de.Why, "a request now would find every slot held: over the limit, and it would charge none of the request's rate descriptors")
	default:
		de.Why = append(de.Why, "a request now would take a slot, given back if a rate descriptor of the request is over its limit")
	}
	return true, nil
}
