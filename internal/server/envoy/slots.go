package envoy

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"sync"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/floodgate/floodgate"
	"github.com/floodgate/floodgate/core/slot"
	"github.com/floodgate/floodgate/internal/lib/storekit"
	"github.com/floodgate/floodgate/internal/server/config"
)

// Concurrency limits through Envoy (floodgate's extension of the domain
// files; see config.EnvoyPermitKey). A request whose descriptors name a
// concurrency descriptor is decided in two parts: its concurrency
// descriptors first, each an acquire (or, in the stream-done call, which
// carries config.EnvoyReleaseKey, a release), then its rate descriptors
// as usual. When a slot is full the rate descriptors are not decided
// (nothing is charged) and the answer is OVER_LIMIT; when a rate
// descriptor is over its limit, the slots just acquired are released, so
// that both pass or neither is charged.
//
// The permit's id is derived from the request's EnvoyPermitKey value and
// the store key, so that the stream-done call names the permit the
// request-time call acquired. Without that entry an acquire still takes
// a slot, which then frees itself after the lease.

// slotPolicies holds the slot.Policy of each (slots, lease) the domains
// use: few, so kept for the Service's life.
type slotPolicies struct {
	mu sync.Mutex
	m  map[slot.Spec]slot.Policy
}

func (s *Service) slotPolicy(c *config.Slots) (slot.Policy, slot.Spec, error) {
	spec, err := slot.New(c.Slots, c.Lease)
	if err != nil {
		return nil, spec, err
	}
	s.slots.mu.Lock()
	defer s.slots.mu.Unlock()
	if p, ok := s.slots.m[spec]; ok {
		return p, spec, nil
	}
	ss, ok := s.store.(slot.Store)
	if !ok {
		return nil, spec, fmt.Errorf("%w: the store keeps no concurrency limits", floodgate.ErrInvalidLimit)
	}
	p, err := ss.PrepareSlots(spec)
	if err != nil {
		return nil, spec, err
	}
	if s.slots.m == nil {
		s.slots.m = map[slot.Spec]slot.Policy{}
	}
	s.slots.m[spec] = p
	return p, spec, nil
}

// slotCheck is one concurrency descriptor of a request.
type slotCheck struct {
	index   int
	policy  slot.Policy
	key, id string
	release bool
	v       slot.Verdict
}

// slotsFirst decides the request when its domain has concurrency
// descriptors and the request names one; done is false otherwise, and
// the caller decides it as usual.
func (s *Service) slotsFirst(ctx context.Context, req *rlsv3.RateLimitRequest) (resp *rlsv3.RateLimitResponse, done bool, err error) {
	doms, _ := s.svc.Prepared().(domains)
	dom := doms[req.GetDomain()]
	if dom == nil || !dom.cfg.HasConcurrency {
		return nil, false, nil
	}
	var checks []slotCheck
	var rest []*rlcommon.RateLimitDescriptor
	var restAt []int
	for i, d := range req.Descriptors {
		es, pb, permit, release := slotEntries(d.GetEntries())
		node := dom.cfg.LookupSlots(es)
		if node == nil {
			rest, restAt = append(rest, d), append(restAt, i)
			continue
		}
		p, _, err := s.slotPolicy(node.Concurrency)
		if err != nil {
			return nil, true, err
		}
		key := slotKey(req.Domain, pb)
		c := slotCheck{index: i, policy: p, key: key, release: release}
		if permit != "" {
			sum := sha256.Sum256([]byte(permit))
			c.id = storekit.NewPermitID(key, [16]byte(sum[:16]))
		}
		checks = append(checks, c)
	}
	if len(checks) == 0 {
		return nil, false, nil
	}
	resp = &rlsv3.RateLimitResponse{OverallCode: rlsv3.RateLimitResponse_OK, Statuses: make([]*rlsv3.RateLimitResponse_DescriptorStatus, len(req.Descriptors))}
	var acquired []*slotCheck
	full := false
	for i := range checks {
		c := &checks[i]
		st := &rlsv3.RateLimitResponse_DescriptorStatus{Code: rlsv3.RateLimitResponse_OK}
		resp.Statuses[c.index] = st
		switch {
		case c.release && c.id == "":
			// Nothing names the permit: it frees itself after its lease.
		case c.release:
			if c.v, _, err = c.policy.Slot(ctx, c.key, slot.Op{Kind: slot.Release, ID: c.id}); err != nil {
				return nil, true, err
			}
		case full:
			// An earlier slot is full: nothing more is taken.
		default:
			id := c.id
			if id == "" {
				var r [16]byte
				if _, err := rand.Read(r[:]); err != nil {
					return nil, true, err
				}
				id = storekit.NewPermitID(c.key, r)
			}
			c.v, _, err = c.policy.Slot(ctx, c.key, slot.Op{Kind: slot.Acquire, ID: id})
			if errors.Is(err, slot.ErrInvalidPermit) {
				// The permit is held already. Envoy names a request by its
				// x-request-id, which a client may choose: taken as held,
				// one id reused would hold any number of requests in
				// flight on one slot, so it is a denial.
				c.v, err = slot.Verdict{}, nil
			}
			if err != nil {
				s.undoSlots(acquired)
				return nil, true, err
			}
			if !c.v.OK {
				full = true
				st.Code = rlsv3.RateLimitResponse_OVER_LIMIT
				s.svc.Denied("envoy:"+req.Domain, deniedKey(req.Descriptors[c.index].GetEntries()))
				break
			}
			c.id = id
			acquired = append(acquired, c)
		}
	}
	if full {
		s.undoSlots(acquired)
		resp.OverallCode = rlsv3.RateLimitResponse_OVER_LIMIT
	} else if len(rest) > 0 {
		sub := &rlsv3.RateLimitRequest{Domain: req.Domain, Descriptors: rest, HitsAddend: req.HitsAddend}
		r, err := s.ShouldRateLimit(ctx, sub)
		if err != nil {
			s.undoSlots(acquired)
			return nil, true, err
		}
		for j, st := range r.Statuses {
			resp.Statuses[restAt[j]] = st
		}
		resp.ResponseHeadersToAdd, resp.RequestHeadersToAdd = r.ResponseHeadersToAdd, r.RequestHeadersToAdd
		if r.OverallCode == rlsv3.RateLimitResponse_OVER_LIMIT {
			resp.OverallCode = r.OverallCode
			s.undoSlots(acquired)
		}
	}
	for i, st := range resp.Statuses {
		if st == nil {
			resp.Statuses[i] = &rlsv3.RateLimitResponse_DescriptorStatus{Code: rlsv3.RateLimitResponse_OK}
		}
	}
	return resp, true, nil
}

// undoSlots releases the slots of a request that is denied after all.
func (s *Service) undoSlots(acquired []*slotCheck) {
	for _, c := range acquired {
		// The request's own context may be ending; the slot must come
		// back.
		c.policy.Slot(context.Background(), c.key, slot.Op{Kind: slot.Release, ID: c.id})
	}
}

// slotEntries returns a descriptor's entries without floodgate's (as
// config's and as Envoy's), and the permit entry's value and whether the
// release marker is there.
// slotKey is the store key of a concurrency descriptor's slots: its
// entries but the markers, hashed when too long.
func slotKey(domain string, pb []*rlcommon.RateLimitDescriptor_Entry) string {
	key := "s" + envoyKey(domain, pb, nil)
	if len(key) > floodgate.MaxKeyLen {
		sum := sha256.Sum256([]byte(key))
		key = "S" + hex.EncodeToString(sum[:])
	}
	return key
}

func slotEntries(es []*rlcommon.RateLimitDescriptor_Entry) (out []config.Entry, pb []*rlcommon.RateLimitDescriptor_Entry, permit string, release bool) {
	out = make([]config.Entry, 0, len(es))
	for _, e := range es {
		switch e.GetKey() {
		case config.EnvoyPermitKey:
			permit = e.GetValue()
		case config.EnvoyReleaseKey:
			release = true
		default:
			out = append(out, config.Entry{Key: e.GetKey(), Value: e.GetValue()})
			pb = append(pb, e)
		}
	}
	return out, pb, permit, release
}
