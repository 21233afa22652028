package envoy

// The domains of a configuration, prepared as floodgate limits when it is
// swapped in; the limits that requests carry; and the store keys.

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"sort"
	"strconv"
	"sync"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"

	"github.com/floodgate/floodgate"
	"github.com/floodgate/floodgate/internal/server/config"
	"github.com/floodgate/floodgate/internal/server/service"
)

// envoyDomain is a domain with a Limiter per limit, made when the
// configuration is swapped in.
type envoyDomain struct {
	cfg  *config.Domain
	lims map[*config.EnvoyLimit]*floodgate.Limiter
	// limited counts the descriptors with a limit (unlimited ones too).
	limited int
}

// domains are a configuration's domains by name, each prepared.
type domains map[string]*envoyDomain

func (s *Service) prepareDomains(cfg *config.Config) (domains, error) {
	doms := make(domains, len(cfg.Domains))
	for name, d := range cfg.Domains {
		ed := &envoyDomain{cfg: d, lims: map[*config.EnvoyLimit]*floodgate.Limiter{}}
		var walk func(n *config.Descriptor) error
		walk = func(n *config.Descriptor) error {
			if n.Limit != nil {
				ed.limited++
			}
			if l := n.Limit; l != nil && l.Limit != (floodgate.Limit{}) {
				lim, err := floodgate.NewLimiter(s.store, []floodgate.Limit{s.envoyLimit(l)}, service.LimiterOptions(s.sopts, "envoy:"+name))
				if err != nil {
					return fmt.Errorf("domain %q, %s: %w", name, n.Path, err)
				}
				ed.lims[l] = lim
			}
			for _, c := range n.Children {
				if err := walk(c); err != nil {
					return err
				}
			}
			return nil
		}
		if err := walk(&d.Root); err != nil {
			return nil, err
		}
		doms[name] = ed
	}
	return doms, nil
}

// Domain is what the dashboard shows of an Envoy domain.
type Domain struct {
	Name string `json:"name"`
	// Descriptors counts the domain's descriptors that have a limit.
	Descriptors int `json:"descriptors"`
	// Hits and OverLimit are envoyproxy/ratelimit's total_hits and
	// over_limit statistics summed over the domain's descriptors since
	// the service started: hits, not requests. Descriptors whose names
	// went to the statistics' overflow are not in them, and where one
	// domain's name is another's followed by a dot, the longer one takes
	// the names both could own.
	Hits      uint64 `json:"hits"`
	OverLimit uint64 `json:"over_limit"`
}

// Domains returns the domains in use, sorted by name. It walks the
// statistics' names (at most maxEnvoyStats), so it is for a page that
// asks, not for the decision path.
func (s *Service) Domains() []Domain {
	doms, _ := s.svc.Prepared().(domains)
	out := make([]Domain, 0, len(doms))
	at := make(map[string]int, len(doms))
	for name, d := range doms {
		at[name] = len(out)
		out = append(out, Domain{Name: name, Descriptors: d.limited})
	}
	s.envoyStats.names.Range(func(k, v any) bool {
		stat, st := k.(string), v.(*envoyStat)
		best := -1
		for i := 0; i < len(stat); i++ { // the longest domain that prefixes stat
			if stat[i] != '.' {
				continue
			}
			if j, ok := at[stat[:i]]; ok {
				best = j
			}
		}
		if best < 0 {
			return true
		}
		if c := st.counts[totalHits].Load(); c != nil {
			out[best].Hits += c.Load()
		}
		if c := st.counts[overLimit].Load(); c != nil {
			out[best].OverLimit += c.Load()
		}
		return true
	})
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// envoyLimit is the floodgate limit that decides l. A counting window is
// decided by one forced charge of the hits (see decideOne), so it is kept
// with a quota of one more than the limit: a count up to the limit then
// leaves at least 1 remaining, and a count over it leaves 0. With the
// atomic option it is a plain window, whose denials charge nothing.
func (s *Service) envoyLimit(l *config.EnvoyLimit) floodgate.Limit {
	if l.Counting && !s.atomic {
		return floodgate.FixedWindow(l.Limit.Quota()+1, l.Limit.Period())
	}
	return l.Limit
}

// envoyKey is the store key of a descriptor's counter:
// "e<len>:<domain>" and each entry's "<len>:<key><len>:<value>", with
// the value replaced by the share_threshold wildcard where shared says.
// The lengths make it unambiguous; rule keys start with "r", redis-cell's
// with "cell:". A key longer than a store takes (floodgate.MaxKeyLen) is
// "E" and the SHA-256 of it in hex instead: descriptors come from the
// requests that Envoy limits, so a client could otherwise send a path or
// header long enough to make the decision fail, which Envoy answers by
// letting the request through (its failure_mode_deny is off by default);
// envoyproxy/ratelimit counts such descriptors like any other.
func envoyKey(domain string, es []*rlcommon.RateLimitDescriptor_Entry, shared []string) string {
	b := make([]byte, 0, 64)
	b = append(b, 'e')
	b = strconv.AppendInt(b, int64(len(domain)), 10)
	b = append(b, ':')
	b = append(b, domain...)
	for i, e := range es {
		v := e.GetValue()
		if i < len(shared) && shared[i] != "" {
			v = shared[i]
		}
		b = append(b, ':')
		b = strconv.AppendInt(b, int64(len(e.GetKey())), 10)
		b = append(b, ':')
		b = append(b, e.GetKey()...)
		b = strconv.AppendInt(b, int64(len(v)), 10)
		b = append(b, ':')
		b = append(b, v...)
	}
	if len(b) > floodgate.MaxKeyLen {
		sum := sha256.Sum256(b)
		return "E" + hex.EncodeToString(sum[:])
	}
	return string(b)
}

// descriptorStatKey names the statistics of a limit that the request
// carried: "domain.key_value.key".
func descriptorStatKey(domain string, es []*rlcommon.RateLimitDescriptor_Entry) string {
	k := domain
	for _, e := range es {
		k += "." + e.GetKey()
		if e.GetValue() != "" {
			k += "_" + e.GetValue()
		}
	}
	return k
}

// overrides holds the limits that requests carry (a descriptor's limit
// field), each prepared once: Envoy sends the same few over and over.
type overrides struct {
	mu   sync.Mutex
	lims map[overrideKey]overrideLimit
	opts *floodgate.Options // the Limiters' (tracing)
}

type overrideKey struct {
	rpu  uint32
	unit config.Unit
}

type overrideLimit struct {
	limit *config.EnvoyLimit
	lim   *floodgate.Limiter
}

// maxOverrides bounds the distinct limits kept; past it, a new one is
// prepared for its request only.
const maxOverrides = 1024

// get returns the counting fixed window of a descriptor's own limit.
func (o *overrides) get(store floodgate.Store, limit func(*config.EnvoyLimit) floodgate.Limit, ov *rlcommon.RateLimitDescriptor_RateLimitOverride) (*config.EnvoyLimit, *floodgate.Limiter, error) {
	k := overrideKey{ov.GetRequestsPerUnit(), config.Unit(ov.GetUnit())}
	if k.unit.Seconds() == 0 {
		return nil, nil, fmt.Errorf("%w: the descriptor's limit has no valid unit (%d)", service.ErrBadRequest, ov.GetUnit())
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	if l, ok := o.lims[k]; ok {
		return l.limit, l.lim, nil
	}
	l := overrideLimit{limit: &config.EnvoyLimit{RequestsPerUnit: k.rpu, Unit: k.unit, Counting: true}}
	if k.rpu > 0 {
		l.limit.Limit = floodgate.FixedWindow(int64(k.rpu), time.Duration(k.unit.Seconds())*time.Second)
		lim, err := floodgate.NewLimiter(store, []floodgate.Limit{limit(l.limit)}, o.opts)
		if err != nil {
			return nil, nil, err
		}
		l.lim = lim
	}
	if o.lims == nil {
		o.lims = map[overrideKey]overrideLimit{}
	}
	if len(o.lims) < maxOverrides {
		o.lims[k] = l
	}
	return l.limit, l.lim, nil
}
