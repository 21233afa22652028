package envoy

import (
	"context"
	"fmt"
	"math"
	"strconv"
	"strings"
	"sync/atomic"
	"time"
	"unicode/utf8"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/floodgate/floodgate"
	"github.com/floodgate/floodgate/internal/lib/slicepool"
	"github.com/floodgate/floodgate/internal/server/config"
	"github.com/floodgate/floodgate/internal/server/service"
	"github.com/floodgate/floodgate/internal/server/statsd"
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
	// GlobalShadowMode is envoyproxy/ratelimit's SHADOW_MODE: a request
	// over its limits is answered OK overall (its statuses still say
	// OVER_LIMIT), and counted in global_shadow_mode. Default: false.
	GlobalShadowMode bool
	// GlobalQuotaMode is envoyproxy/ratelimit's QUOTA_MODE: every
	// descriptor is decided as a quota_mode one. Default: false.
	GlobalQuotaMode bool
	// NearLimitRatio is envoyproxy/ratelimit's NEAR_LIMIT_RATIO: the
	// share of the limit above which hits count in near_limit, above 0
	// and at most 1. Default: 0.8.
	NearLimitRatio float32
	// HeaderNames are the names of the RateLimitHeaders, in the order
	// limit, remaining, reset: envoyproxy/ratelimit's LIMIT_LIMIT_HEADER,
	// LIMIT_REMAINING_HEADER and LIMIT_RESET_HEADER. An empty one is its
	// default: RateLimit-Limit, RateLimit-Remaining, RateLimit-Reset.
	HeaderNames [3]string
	// StatsD, when set, gets envoyproxy/ratelimit's statistics under its
	// StatsD names: per descriptor (StatsDPrefix), and the service's and
	// the gRPC server's (see RegisterStatsD). Default: none.
	StatsD *statsd.Sink
}

// defaultHeaderNames are the RateLimit headers' names by default.
var defaultHeaderNames = [3]string{"RateLimit-Limit", "RateLimit-Remaining", "RateLimit-Reset"}

// Service decides Envoy's requests against the domains of the rules in
// use of a service.Service, on its store, counted in its metrics. It is
// safe for concurrent use.
type Service struct {
	svc        *service.Service
	store      floodgate.Store
	atomic     bool // STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT
	rlsHeaders bool
	headers    [3]string
	shadow     bool // SHADOW_MODE
	quota      bool // QUOTA_MODE
	nearRatio  float32
	now        func() time.Time
	overrides  overrides
	envoyStats *envoyMetrics
	// envoyOutcome caches decisions' counters of Envoy's allowed (0) and
	// denied (1) answers, found on first use: finding one joins its labels.
	envoyOutcome [2]atomic.Pointer[atomic.Uint64]
	// globalShadow counts the answers SHADOW_MODE turned to OK; nil
	// without it.
	globalShadow *atomic.Uint64
	sd           serviceStatsD
	// checks are Envoy requests' checks, reused: the answer holds nothing
	// of them.
	checks slicepool.Pool[envoyCheck]
	sopts  *service.Options // the service's options, for its Limiters' (tracing)
	// slots are the concurrency descriptors' policies (slots.go).
	slots slotPolicies
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
	if o.NearLimitRatio == 0 {
		o.NearLimitRatio = 0.8
	}
	if !(o.NearLimitRatio > 0 && o.NearLimitRatio <= 1) {
		return nil, fmt.Errorf("near-limit ratio %v is not above 0 and at most 1", o.NearLimitRatio)
	}
	for i, h := range o.HeaderNames {
		if h == "" {
			o.HeaderNames[i] = defaultHeaderNames[i]
		} else if !validHeaderName(h) {
			return nil, fmt.Errorf("header name %q is not a valid HTTP header name", h)
		}
	}
	var so service.Options
	if sopts != nil {
		so = *sopts
	}
	s := &Service{store: store, atomic: o.StopIncrementWhenOverLimit, rlsHeaders: o.RateLimitHeaders, now: o.Now,
		headers: o.HeaderNames, shadow: o.GlobalShadowMode, quota: o.GlobalQuotaMode, nearRatio: o.NearLimitRatio}
	s.sopts = &so
	s.overrides.opts = service.LimiterOptions(&so, "envoy")
	so.Prepare = func(cfg *config.Config) (any, error) { return s.prepareDomains(cfg) }
	svc, err := service.New(store, cfg, &so)
	if err != nil {
		return nil, err
	}
	s.svc = svc
	s.envoyStats = newEnvoyMetrics(svc.Metrics, o.StatsD)
	if o.GlobalShadowMode {
		s.globalShadow = &atomic.Uint64{}
		svc.Metrics.NewCounterFunc("ratelimit_service_global_shadow_mode", "Envoy answers that SHADOW_MODE turned from OVER_LIMIT to OK, as envoyproxy/ratelimit's global_shadow_mode.", s.globalShadow.Load)
	}
	if o.StatsD != nil {
		s.sd = newServiceStatsD(o.StatsD, svc, s.globalShadow)
	}
	return s, nil
}

// Rules returns the service.Service whose rules and store s decides with.
func (s *Service) Rules() *service.Service { return s.svc }

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
// docs/envoy.md for the differences. Its errors wrap
// service.ErrBadRequest (an empty domain, no descriptors, a descriptor
// limit with no unit) or are the store's.
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
	if resp, done, err := s.slotsFirst(ctx, req); done { // concurrency descriptors (slots.go)
		return resp, err
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
			c.limit, c.lim, c.quota = l, lim, s.quota
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
		c.shadow, c.quota = m.Node.ShadowMode, m.Node.QuotaMode || s.quota
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
	return s.envoyResponse(req.Domain, req.Descriptors, checks), nil
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
// Each descriptor over its limit (shadow_mode and quota_mode ones too, as
// a shadow rule's denials are) is reported to the service's OnDenied, as
// rule "envoy:<domain>"; an allowed request reports nothing.
func (s *Service) envoyResponse(domain string, entries []*rlcommon.RateLimitDescriptor, checks []envoyCheck) *rlsv3.RateLimitResponse {
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
		if c.over {
			s.svc.Denied("envoy:"+domain, deniedKey(entries[i].GetEntries()))
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
	if s.shadow && resp.OverallCode == rlsv3.RateLimitResponse_OVER_LIMIT {
		// SHADOW_MODE: reported, counted, never enforced.
		resp.OverallCode = rlsv3.RateLimitResponse_OK
		s.globalShadow.Add(1)
	}
	s.countEnvoy(resp.OverallCode == rlsv3.RateLimitResponse_OK)
	if s.rlsHeaders && minimum != nil {
		resp.ResponseHeadersToAdd = []*corev3.HeaderValue{
			{Key: s.headers[0], Value: strconv.FormatUint(uint64(minimum.CurrentLimit.RequestsPerUnit), 10)},
			{Key: s.headers[1], Value: strconv.FormatUint(uint64(minimum.LimitRemaining), 10)},
			{Key: s.headers[2], Value: strconv.FormatInt(minimum.DurationUntilReset.GetSeconds(), 10)},
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
	near := int64(math.Floor(float64(float32(limit) * s.nearRatio)))
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

// deniedKey names a denied descriptor for the dashboard's top keys:
// "key1=value1,key2=value2", cut to floodgate.MaxKeyLen bytes (at a rune
// boundary, ending in "…") as request values could make it as long as the
// request.
func deniedKey(es []*rlcommon.RateLimitDescriptor_Entry) string {
	var b strings.Builder
	for i, e := range es {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(e.GetKey())
		b.WriteByte('=')
		b.WriteString(e.GetValue())
		if b.Len() > floodgate.MaxKeyLen {
			break
		}
	}
	k := b.String()
	if len(k) <= floodgate.MaxKeyLen {
		return k
	}
	const more = "…"
	n := floodgate.MaxKeyLen - len(more)
	for n > 0 && !utf8.RuneStart(k[n]) {
		n--
	}
	return k[:n] + more
}
