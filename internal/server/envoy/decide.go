package envoy

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"math"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/floodgate/floodgate"
	"github.com/floodgate/floodgate/internal/lib/slicepool"
	"github.com/floodgate/floodgate/internal/server/config"
	"github.com/floodgate/floodgate/internal/server/metrics"
	"github.com/floodgate/floodgate/internal/server/service"
)

// This file is Envoy's rate limit service (RLS v3) over the
// envoyproxy/ratelimit domains of the configuration: the decisions and
// the answer, field by field as envoyproxy/ratelimit gives them. The gRPC
// and /json servers are thin layers over ShouldRateLimit.

// MaxDescriptors is the most descriptors of one Envoy request. Envoy
// sends one per rate limit action of a route, a handful; a request's
// descriptors are decided in one script call, which holds Redis while it
// runs, and every other decision waits for it.
const MaxDescriptors = 1000

// Options configures Envoy's decisions. The zero value (or nil) gives the
// defaults.
type Options struct {
	// StopIncrementWhenOverLimit is envoyproxy/ratelimit's
	// STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT, done exactly: an Envoy
	// request over the limit on any descriptor charges none of them.
	// Default: false, hits over the limit count, as there.
	StopIncrementWhenOverLimit bool
	// RateLimitHeaders adds RateLimit-Limit, RateLimit-Remaining and
	// RateLimit-Reset to Envoy answers, for the descriptor closest to its
	// limit, as envoyproxy/ratelimit's LIMIT_RESPONSE_HEADERS_ENABLED.
	RateLimitHeaders bool
	// Now is the clock of Envoy answers' DurationUntilReset. Default:
	// time.Now.
	Now func() time.Time
}

// Service decides Envoy's requests against the domains of the rules in
// use of a service.Service, on its store, counted in its metrics. It is
// safe for concurrent use.
type Service struct {
	svc        *service.Service
	store      floodgate.Store
	atomic     bool // STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT
	rlsHeaders bool
	now        func() time.Time
	overrides  overrides
	envoyStats *envoyMetrics
	// envoyOutcome caches decisions' counters of Envoy's allowed (0) and
	// denied (1) answers, found on first use: finding one joins its labels.
	envoyOutcome [2]atomic.Pointer[atomic.Uint64]
	// checks are Envoy requests' checks, reused: the answer holds nothing
	// of them.
	checks slicepool.Pool[envoyCheck]
}

// New returns the service.Service over store with the rules cfg and
// sopts (whose Prepare it sets), and Envoy's decisions over it. Both
// serve the same configuration: a reload of the rules prepares the
// domains too, and is refused when they cannot be prepared.
func New(store floodgate.Store, cfg *config.Config, sopts *service.Options, opts *Options) (*Service, error) {
	var o Options
	if opts != nil {
		o = *opts
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	var so service.Options
	if sopts != nil {
		so = *sopts
	}
	s := &Service{store: store, atomic: o.StopIncrementWhenOverLimit, rlsHeaders: o.RateLimitHeaders, now: o.Now}
	so.Prepare = func(cfg *config.Config) (any, error) { return s.prepareDomains(cfg) }
	svc, err := service.New(store, cfg, &so)
	if err != nil {
		return nil, err
	}
	s.svc = svc
	s.envoyStats = newEnvoyMetrics(svc.Metrics)
	return s, nil
}

// Rules returns the service.Service whose rules and store s decides with.
func (s *Service) Rules() *service.Service { return s.svc }

// envoyDomain is a domain with a Limiter per limit, made when the
// configuration is swapped in.
type envoyDomain struct {
	cfg  *config.Domain
	lims map[*config.EnvoyLimit]*floodgate.Limiter
}

// domains are a configuration's domains by name, each prepared.
type domains map[string]*envoyDomain

func (s *Service) prepareDomains(cfg *config.Config) (domains, error) {
	doms := make(domains, len(cfg.Domains))
	for name, d := range cfg.Domains {
		ed := &envoyDomain{cfg: d, lims: map[*config.EnvoyLimit]*floodgate.Limiter{}}
		var walk func(n *config.Descriptor) error
		walk = func(n *config.Descriptor) error {
			if l := n.Limit; l != nil && l.Limit != (floodgate.Limit{}) {
				lim, err := floodgate.NewLimiter(s.store, []floodgate.Limit{s.envoyLimit(l)}, nil)
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

// envoyCheck is one descriptor of a request on its way to a decision.
type envoyCheck struct {
	limit  *config.EnvoyLimit
	lim    *floodgate.Limiter
	key    string // the store key
	stat   string // the statistics' name
	hits   int64
	shadow bool
	quota  bool // quota_mode: over the limit is reported, not enforced
	// unlimited: the descriptor's rule is unlimited (LimitRemaining is
	// then the largest uint32, and no limit applies).
	unlimited bool
	res       floodgate.Result
	over      bool
	before    int64 // the counting window's count before the hits
}

// ShouldRateLimit is RLS v3's RateLimitService.ShouldRateLimit. It decides
// each descriptor of req against the domain's limits (or the limit the
// descriptor carries) and answers as envoyproxy/ratelimit does; see
// docs/envoy.md for the differences. Its errors wrap service.ErrBadRequest (an empty
// domain, no descriptors, a descriptor limit with no unit) or are the
// store's.
func (s *Service) ShouldRateLimit(ctx context.Context, req *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
	if req.GetDomain() == "" {
		return nil, fmt.Errorf("%w: rate limit domain must not be empty", service.ErrBadRequest)
	}
	if len(req.GetDescriptors()) == 0 {
		return nil, fmt.Errorf("%w: rate limit descriptor list must not be empty", service.ErrBadRequest)
	}
	if n := len(req.Descriptors); n > MaxDescriptors {
		return nil, fmt.Errorf("%w: rate limit descriptor list holds %d descriptors, more than the maximum %d", service.ErrBadRequest, n, MaxDescriptors)
	}
	doms, _ := s.svc.Prepared().(domains)
	dom := doms[req.Domain]
	cp := s.checks.Get(len(req.Descriptors))
	defer s.checks.Put(cp)
	checks := *cp
	var replaced map[string]bool
	for i, d := range req.Descriptors {
		c := &checks[i]
		c.hits = hitsAddend(req, d)
		if dom == nil {
			continue // an unknown domain has no limits
		}
		if ov := d.GetLimit(); ov != nil {
			l, lim, err := s.overrides.get(s.store, s.envoyLimit, ov)
			if err != nil {
				return nil, err
			}
			c.limit, c.lim = l, lim
			c.stat = descriptorStatKey(req.Domain, d.GetEntries())
			c.key = envoyKey(req.Domain, d.GetEntries(), nil)
			continue
		}
		m := dom.cfg.Lookup(entries(d.GetEntries()))
		if m.Limit == nil {
			continue
		}
		if m.Limit.Unlimited {
			c.unlimited = true
		}
		for _, r := range m.Limit.Replaces {
			if replaced == nil {
				replaced = map[string]bool{}
			}
			replaced[r] = true
		}
		c.limit, c.lim, c.stat = m.Limit, dom.lims[m.Limit], m.StatKey
		c.shadow, c.quota = m.Node.ShadowMode, m.Node.QuotaMode
		c.key = envoyKey(req.Domain, d.GetEntries(), m.Shared)
	}
	for i := range checks {
		c := &checks[i]
		if c.limit != nil && (c.unlimited || (c.limit.Name != "" && replaced[c.limit.Name])) {
			c.limit = nil
		}
		if c.limit != nil && c.lim == nil { // requests_per_unit: 0
			c.over = true
		}
	}
	if err := s.decideEnvoy(ctx, checks); err != nil {
		return nil, err
	}
	return s.envoyResponse(checks), nil
}

// decideEnvoy decides every check of a request in one group
// (floodgate.AllowGroup): one script call on Redis, the descriptors in
// the request's order, so that descriptors on one counter are taken as
// envoyproxy/ratelimit's pipeline applies them. A counting window counts
// hits over its limit too, unless the atomic option is on: then the group
// is all or nothing, and a request over any enforced limit charges none.
func (s *Service) decideEnvoy(ctx context.Context, checks []envoyCheck) error {
	// With the atomic option, a request that a limit of 0 denies before
	// any store call (requests_per_unit: 0) charges nothing: a request
	// that can never pass (a cost over its quota, on a key of the group)
	// joins the group, so that the group is undone as a whole and each
	// check still learns whether it was over its own limit.
	blocked := false
	for i := range checks {
		c := &checks[i]
		blocked = blocked || (s.atomic && c.over && !(c.shadow || c.quota))
	}
	var buf [8]floodgate.Request
	var at [8]int
	reqs, which := buf[:0], at[:0]
	for i := range checks {
		c := &checks[i]
		if c.limit == nil || c.lim == nil {
			continue
		}
		r := floodgate.Request{Limiter: c.lim, Key: c.key, N: min(c.hits, floodgate.MaxQuota), Advisory: c.shadow || c.quota}
		if c.limit.Counting && !s.atomic {
			// Charged whatever its count, as its INCRBY is; its limiter's
			// quota is one more than the limit (see envoyLimit).
			r.N, r.Force = min(c.hits, int64(c.limit.RequestsPerUnit)+1), true
		}
		reqs, which = append(reqs, r), append(which, i)
	}
	if blocked && len(reqs) > 0 {
		r := reqs[0]
		r.N, r.Advisory = r.Limiter.Limits()[0].Quota()+1, false
		reqs = append(reqs, r)
	}
	if len(reqs) > 0 {
		start := time.Now()
		err := floodgate.AllowGroup(ctx, reqs, s.atomic)
		s.svc.ObserveStore(time.Since(start))
		if err != nil {
			s.svc.KeyFailed("envoy", err)
			return err
		}
	}
	for j := range which {
		decided(&checks[which[j]], &reqs[j])
	}
	for i := range checks {
		if c := &checks[i]; c.limit != nil {
			s.envoyStats.Add(uint64(c.hits), totalHits, c.stat)
		}
	}
	return nil
}

// decided reads a check's outcome from its request's Result. A forced
// charge of a counting window was within the limit when at least 1
// remains. A request that the atomic option undid is within its own limit
// (not Allowed, RetryAfter 0), and reports the state without its hits.
func decided(c *envoyCheck, r *floodgate.Request) {
	res, limit := r.Result, int64(c.limit.RequestsPerUnit)
	if r.Force {
		c.over = res.Remaining == 0
		if !c.over {
			res.Remaining--
			c.before = limit - res.Remaining - c.hits
		} else {
			// The count is over the limit; by how much is not known, so
			// the statistics count every hit as over it.
			c.before = limit
		}
		c.res = res
		return
	}
	undone := !res.Allowed && res.RetryAfter == 0
	c.res, c.over = res, !res.Allowed && !undone
	c.before = res.Quota - res.Remaining
	if res.Allowed {
		c.before -= c.hits
	}
}

// envoyResponse builds the answer: a status per descriptor and the overall
// code, with the RateLimit headers when they are enabled. As in
// envoyproxy/ratelimit since March 2026, a quota_mode descriptor over its
// limit is OVER_LIMIT in its status, and makes the overall code
// OVER_LIMIT only when every quota_mode descriptor of the request is over
// its limit: the request may pass while any quota has room.
func (s *Service) envoyResponse(checks []envoyCheck) *rlsv3.RateLimitResponse {
	resp := &rlsv3.RateLimitResponse{OverallCode: rlsv3.RateLimitResponse_OK, Statuses: make([]*rlsv3.RateLimitResponse_DescriptorStatus, len(checks))}
	quotas, quotasOver := 0, 0
	// The statuses' messages, allocated together rather than one by one.
	parts := make([]statusParts, len(checks))
	now := s.now()
	var minimum *rlsv3.RateLimitResponse_DescriptorStatus
	minRemaining := uint32(math.MaxUint32)
	for i := range checks {
		c := &checks[i]
		st := &parts[i].status
		st.Code = rlsv3.RateLimitResponse_OK
		resp.Statuses[i] = st
		if c.unlimited {
			st.LimitRemaining = math.MaxUint32
			continue
		}
		if c.limit == nil {
			continue
		}
		lim, reset := &parts[i].limit, &parts[i].reset
		lim.Name, lim.RequestsPerUnit, lim.Unit = c.limit.Name, c.limit.RequestsPerUnit, rlsv3.RateLimitResponse_RateLimit_Unit(c.limit.Unit)
		d := s.untilReset(c, now)
		reset.Seconds, reset.Nanos = int64(d/time.Second), int32(d%time.Second)
		st.CurrentLimit, st.DurationUntilReset = lim, reset
		if !c.over {
			st.LimitRemaining = uint32(min(c.res.Remaining, math.MaxUint32))
		}
		s.count(c)
		if c.quota {
			quotas++
		}
		switch {
		case c.over && c.shadow:
			// shadow_mode: counted, never denies.
		case c.over && c.quota:
			st.Code = rlsv3.RateLimitResponse_OVER_LIMIT
			quotasOver++
		case c.over:
			st.Code = rlsv3.RateLimitResponse_OVER_LIMIT
			resp.OverallCode = rlsv3.RateLimitResponse_OVER_LIMIT
		}
		if st.CurrentLimit != nil && st.LimitRemaining < minRemaining {
			minimum, minRemaining = st, st.LimitRemaining
		}
		if st.Code == rlsv3.RateLimitResponse_OVER_LIMIT && !c.quota {
			minimum, minRemaining = st, 0
		}
	}
	if quotas > 0 && quotasOver == quotas {
		resp.OverallCode = rlsv3.RateLimitResponse_OVER_LIMIT
	}
	s.countEnvoy(resp.OverallCode == rlsv3.RateLimitResponse_OK)
	if s.rlsHeaders && minimum != nil {
		resp.ResponseHeadersToAdd = []*corev3.HeaderValue{
			{Key: "RateLimit-Limit", Value: strconv.FormatUint(uint64(minimum.CurrentLimit.RequestsPerUnit), 10)},
			{Key: "RateLimit-Remaining", Value: strconv.FormatUint(uint64(minimum.LimitRemaining), 10)},
			{Key: "RateLimit-Reset", Value: strconv.FormatInt(minimum.DurationUntilReset.GetSeconds(), 10)},
		}
	}
	return resp
}

// countEnvoy counts an Envoy answer in decisions, under the rule "envoy".
func (s *Service) countEnvoy(allowed bool) {
	i, outcome := 1, "denied"
	if allowed {
		i, outcome = 0, "allowed"
	}
	c := s.envoyOutcome[i].Load()
	if c == nil {
		c = s.svc.DecisionCounter("envoy", outcome)
		s.envoyOutcome[i].Store(c)
	}
	c.Add(1)
}

// statusParts is the messages of one descriptor's status in an answer.
type statusParts struct {
	status rlsv3.RateLimitResponse_DescriptorStatus
	limit  rlsv3.RateLimitResponse_RateLimit
	reset  durationpb.Duration
}

// untilReset is DurationUntilReset: for envoyproxy/ratelimit's window, as
// it computes it, the whole seconds to the end of the unit (a unit of
// one, even when nothing was counted); for floodgate's algorithms, the
// time until the key is full again, rounded up to the second.
func (s *Service) untilReset(c *envoyCheck, now time.Time) time.Duration {
	if c.limit.Counting || c.lim == nil {
		period := c.limit.Unit.Seconds()
		if c.limit.Limit.Period() > 0 {
			period = int64(c.limit.Limit.Period() / time.Second)
		}
		sec := now.Unix()
		return time.Duration(period-sec%period) * time.Second
	}
	return (c.res.ResetAfter + time.Second - 1).Truncate(time.Second)
}

// count adds a decided check to the per-descriptor statistics
// envoyproxy/ratelimit keeps: within, near (over 80% of the limit) and
// over the limit, and over it in shadow mode. They are measured against
// the limit that decided: requests_per_unit for a counting window, the
// algorithm's quota (its burst) otherwise, since a bucket whose burst is
// below requests_per_unit denies before that count is reached. Each
// amount is kept within 0 and the hits, so that no counter can wrap.
func (s *Service) count(c *envoyCheck) {
	limit := int64(c.limit.RequestsPerUnit)
	if !c.limit.Counting && c.lim != nil {
		limit = c.res.Quota
	}
	near := int64(math.Floor(float64(float32(limit) * 0.8)))
	after := c.before + c.hits
	add := func(n int64, kind int) {
		s.envoyStats.Add(uint64(min(max(n, 0), c.hits)), kind, c.stat)
	}
	switch {
	case !c.over:
		add(c.hits, withinLimit)
		if after > near {
			add(after-max(near, c.before), nearLimit)
		}
	case c.before >= limit || after <= limit:
		add(c.hits, overLimit)
	default:
		add(after-limit, overLimit)
		add(limit-max(near, c.before), nearLimit)
	}
	if c.over && c.shadow {
		add(min(c.hits, after-limit), shadowMode)
	}
}

// hitsAddend is a descriptor's cost: its own hits_addend when set (0
// then peeks), else the request's, where 0 means 1.
func hitsAddend(req *rlsv3.RateLimitRequest, d *rlcommon.RateLimitDescriptor) int64 {
	h := uint64(max(req.GetHitsAddend(), 1))
	if v := d.GetHitsAddend(); v != nil {
		h = v.GetValue()
	}
	return int64(min(h, math.MaxInt64))
}

func entries(es []*rlcommon.RateLimitDescriptor_Entry) []config.Entry {
	out := make([]config.Entry, len(es))
	for i, e := range es {
		out[i] = config.Entry{Key: e.GetKey(), Value: e.GetValue()}
	}
	return out
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
		lim, err := floodgate.NewLimiter(store, []floodgate.Limit{limit(l.limit)}, nil)
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

// The statistics envoyproxy/ratelimit keeps per descriptor.
const (
	totalHits = iota
	overLimit
	nearLimit
	withinLimit
	shadowMode
	numEnvoyStats
)

var envoyStatNames = [numEnvoyStats]string{"total_hits", "over_limit", "near_limit", "within_limit", "shadow_mode"}

// envoyMetrics are envoyproxy/ratelimit's per-descriptor counters, named
// and labelled as its documented statsd-to-Prometheus mapping names them:
// ratelimit_service_rate_limit_total_hits{domain, key1, key2}, where key1
// and key2 are the first two parts of the descriptor's name.
type envoyMetrics struct {
	vecs     [numEnvoyStats]*metrics.CounterVec
	names    sync.Map // stat key -> *envoyStat, at most maxEnvoyStats
	n        atomic.Int64
	overflow envoyStat // the names past maxEnvoyStats, and the too long
}

// envoyStat is one descriptor name's labels and, once used, its counters,
// kept so that counting does not join the labels again.
type envoyStat struct {
	labels [3]string
	counts [numEnvoyStats]atomic.Pointer[atomic.Uint64]
}

// maxEnvoyStats bounds the label sets, and the names kept to find them:
// names come from the configuration, but detailed_metric and
// value_to_metric put request values in them. maxEnvoyStatLen bounds a
// name's bytes, which request values could make as long as the
// request. The names past either count under key1="overflow".
const (
	maxEnvoyStats   = 10000
	maxEnvoyStatLen = 1024
)

func newEnvoyMetrics(r *metrics.Registry) *envoyMetrics {
	m := &envoyMetrics{}
	m.overflow.labels = [3]string{"", "overflow", ""}
	for kind, name := range envoyStatNames {
		m.vecs[kind] = r.NewCounterVec("ratelimit_service_rate_limit_"+name,
			"envoyproxy/ratelimit's "+name+" per descriptor, labelled as its default Prometheus mapping labels it.", "domain", "key1", "key2")
	}
	return m
}

var ipv4 = regexp.MustCompile(`\d{1,3}\.\d{1,3}\.\d{1,3}\.\d{1,3}`)

// Add adds n to the counter kind (totalHits, ...) of the descriptor named
// stat.
func (m *envoyMetrics) Add(n uint64, kind int, stat string) {
	if n == 0 {
		return
	}
	st := m.stat(stat)
	c := st.counts[kind].Load()
	if c == nil {
		c = m.vecs[kind].With(st.labels[:]...) // the same counter, whoever makes it first
		st.counts[kind].Store(c)
	}
	c.Add(n)
}

// stat returns the labels and counters of the descriptor named stat:
// its own while fewer than maxEnvoyStats names are kept, the overflow's
// past them, which are not kept, so that a descriptor with
// detailed_metric on a client's address holds memory for 10,000 names
// and no more.
func (m *envoyMetrics) stat(stat string) *envoyStat {
	if v, ok := m.names.Load(stat); ok {
		return v.(*envoyStat)
	}
	if len(stat) > maxEnvoyStatLen || m.n.Load() >= maxEnvoyStats { // read first: no write per request once full
		return &m.overflow
	}
	if m.n.Add(1) > maxEnvoyStats { // a place, taken before the name is kept
		m.n.Add(-1)
		return &m.overflow
	}
	st := &envoyStat{}
	// As envoyproxy/ratelimit sanitizes statsd names: an IPv4 address's
	// dots and any : or | become _.
	clean := strings.NewReplacer(":", "_", "|", "_").Replace(stat)
	clean = ipv4.ReplaceAllStringFunc(clean, func(ip string) string { return strings.ReplaceAll(ip, ".", "_") })
	parts := strings.SplitN(clean, ".", 4)
	copy(st.labels[:], parts)
	v, loaded := m.names.LoadOrStore(stat, st)
	if loaded {
		m.n.Add(-1) // another caller kept it first
	}
	return v.(*envoyStat)
}
