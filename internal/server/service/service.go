package service

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/floodgate/floodgate"
	"github.com/floodgate/floodgate/fallback"
	"github.com/floodgate/floodgate/internal/lib/lograte"
	"github.com/floodgate/floodgate/internal/server/config"
	"github.com/floodgate/floodgate/internal/server/metrics"
)

// The service's own errors; both are the caller's fault.
var (
	// ErrUnknownRule: no rule has the name asked for.
	ErrUnknownRule = errors.New("unknown rule")
	// ErrBadRequest: a parameter is out of range.
	ErrBadRequest = errors.New("bad request")
)

// MaxKeyLen is the longest key a client may send, in bytes. The store
// keys are longer: they carry the rule's name.
const MaxKeyLen = 512

// Decision is the outcome of a check against a rule.
type Decision struct {
	Rule   string
	Shadow bool // the rule is in shadow mode: Allowed is true whatever Result says
	// Allowed is what the caller should do: Result.Allowed, or true for a
	// shadow rule.
	Allowed bool
	Result  floodgate.Result
	// Limit is the name of the limit that Result describes ("" when it
	// has none), from the same rules that decided.
	Limit string
	// Limits are the rule's limits that decided, for a RateLimit-Policy
	// header that matches the answer even across a reload. Set by Check.
	Limits []floodgate.Limit
}

// Service decides requests against the current rules. It is safe for
// concurrent use.
type Service struct {
	onDenied   func(rule, key string)
	onAcquired func(rule, key string) // Options.OnAcquired
	store      floodgate.Store
	fallback   *fallback.Store // nil without Redis
	rules      atomic.Pointer[ruleset]
	log        *slog.Logger

	Metrics   *metrics.Registry
	decisions *metrics.CounterVec
	latency   *metrics.Histogram
	reloads   *metrics.CounterVec
	lastOK    atomic.Int64 // unix seconds of the last good (re)load
	// keyErrors counts the decisions that failed on their key alone
	// (floodgate.ErrKey), by rule and kind; keyLog limits their log lines.
	keyErrors *metrics.CounterVec
	keyLog    *lograte.Limiter
	slotOps   *metrics.CounterVec // concurrency rules' operations (concurrency.go)

	load       config.LoadOptions // how Reload reads the rules
	prepareExt func(*config.Config) (any, error)
	tp         trace.TracerProvider // nil: not traced
	traceKeys  bool
}

// ruleset is a configuration with its rules prepared on the store once,
// when the configuration is swapped in.
type ruleset struct {
	cfg   *config.Config
	rules map[string]*rule
	// prepared is what Options.Prepare made of cfg (Envoy's domains).
	prepared any
	// slots are the concurrency rules, by name (concurrency.go).
	slots map[string]*slotRule
}

// rule is a configured rule, its Limiter, and the prefix of its keys in
// the store.
type rule struct {
	config.Rule
	lim    *floodgate.Limiter
	prefix string // "r<length of name>:<name>:"; see ruleKey
}

func (s *Service) prepare(cfg *config.Config) (*ruleset, error) {
	rs := &ruleset{cfg: cfg, rules: make(map[string]*rule, len(cfg.Rules))}
	for _, r := range cfg.Rules {
		lim, err := floodgate.NewLimiter(s.store, r.Limits, s.LimiterOptions(r.Name))
		if err != nil {
			return nil, fmt.Errorf("rule %q: %w", r.Name, err)
		}
		rs.rules[r.Name] = &rule{Rule: r, lim: lim, prefix: ruleKey(r.Name, "")}
	}
	if err := s.prepareSlots(cfg, rs); err != nil {
		return nil, err
	}
	if s.prepareExt != nil {
		p, err := s.prepareExt(cfg)
		if err != nil {
			return nil, err
		}
		rs.prepared = p
	}
	return rs, nil
}

// Options configures a Service. The zero value (or nil) gives the
// defaults.
type Options struct {
	// Fallback is the fallback store that the store is or wraps, whose
	// state readiness and metrics report. Default: none.
	Fallback *fallback.Store
	// Memory is the memory store in use, whose keys, bytes and evictions
	// the metrics report: the store itself, or Redis's local fallback.
	Memory *floodgate.MemoryStore
	// Logger receives reloads and their failures. Default: slog.Default().
	Logger *slog.Logger
	// OnDenied, when set, is called with the rule and the key of every
	// denied check (shadow rules' included; CL.THROTTLE's as rule
	// "CL.THROTTLE"), from the checking goroutine. It must be fast.
	OnDenied func(rule, key string)
	// OnAcquired, when set, is called with the concurrency rule and the
	// key of every acquire that got a slot, from the acquiring goroutine.
	// It must be fast.
	OnAcquired func(rule, key string)
	// MergeDomains is envoyproxy/ratelimit's MERGE_DOMAIN_CONFIG: Reload
	// reads a directory whose files share a domain as one domain (see
	// config.LoadOptions). Default: false, such a directory is an error.
	MergeDomains bool
	// Now is the clock of the key errors' log rate. Default: time.Now.
	Now func() time.Time
	// Prepare, when set, makes another surface's state from each
	// configuration before it is swapped in (package envoy's domains), so
	// that the rules and that state in use always come from one
	// configuration, and one it fails on is refused as an invalid rule is.
	// Prepared returns what it made. Default: none.
	Prepare func(*config.Config) (any, error)
	// TracerProvider, when set, traces the rules' decisions (see
	// floodgate.Options.TracerProvider), each span with the rule's name
	// as AttrRule, and each reload of the rules, as SpanReload. Default:
	// nil, nothing is traced.
	TracerProvider trace.TracerProvider
	// TraceKeys records the keys in the decisions' spans, as the store
	// has them: the rule's prefix, then the client's key (see
	// floodgate.Options.TraceKeys). Default: false, keys can be personal
	// data.
	TraceKeys bool
}

// SpanReload is the name of the span of a reload of the rules (Reload,
// Apply), whose attributes are the file (AttrFile), the rules loaded
// (AttrRules) and, when it fails, error.type "invalid_rules".
const SpanReload = "floodgate.reload"

// The attributes of the service's spans.
const (
	AttrRule  = attribute.Key("floodgate.rule")
	AttrFile  = attribute.Key("floodgate.config.file")
	AttrRules = attribute.Key("floodgate.config.rules")
)

// LimiterOptions returns the options of a Limiter that decides for rule
// (a rule's name, or another surface's, such as "envoy:<domain>"): with
// Options.TracerProvider, traced with the rule's name; nil otherwise.
func (s *Service) LimiterOptions(rule string) *floodgate.Options {
	return LimiterOptions(&Options{TracerProvider: s.tp, TraceKeys: s.traceKeys}, rule)
}

// LimiterOptions is Service.LimiterOptions for a Service made with o,
// for a surface that prepares its Limiters before the Service is made
// (package envoy's domains).
func LimiterOptions(o *Options, rule string) *floodgate.Options {
	if o == nil || o.TracerProvider == nil {
		return nil
	}
	return &floodgate.Options{TracerProvider: o.TracerProvider, TraceAttributes: attribute.NewSet(AttrRule.String(rule)), TraceKeys: o.TraceKeys}
}

// New returns a Service over store with the rules cfg. It fails when the
// store cannot prepare the rules' limits.
func New(store floodgate.Store, cfg *config.Config, opts *Options) (*Service, error) {
	var o Options
	if opts != nil {
		o = *opts
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	fb := o.Fallback
	if o.Now == nil {
		o.Now = time.Now
	}
	s := &Service{store: store, fallback: fb, log: o.Logger, Metrics: &metrics.Registry{}, onDenied: o.OnDenied, onAcquired: o.OnAcquired,
		load: config.LoadOptions{MergeDomains: o.MergeDomains}, prepareExt: o.Prepare, tp: o.TracerProvider, traceKeys: o.TraceKeys}
	rs, err := s.prepare(cfg)
	if err != nil {
		return nil, err
	}
	s.rules.Store(rs)
	s.lastOK.Store(time.Now().Unix())
	m := s.Metrics
	s.decisions = m.NewCounterVec("floodgate_decisions_total", "Decisions by rule and outcome (allowed, denied, shadow_denied, error).", "rule", "outcome")
	s.latency = m.NewHistogram("floodgate_store_latency_seconds", "Time the store took to decide.",
		[]float64{0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1})
	s.reloads = m.NewCounterVec("floodgate_config_reloads_total", "Rule file reloads by result (success, failure).", "result")
	s.keyErrors = m.NewCounterVec("floodgate_key_errors_total", "Calls that failed on their key alone while Redis works, by rule (envoy for Envoy's, CL.THROTTLE) and kind (wrong_type, corrupt, noperm): the key holds data that is not floodgate's, or an ACL refuses it.", "rule", "kind")
	s.keyLog = lograte.New(time.Second, o.Now)
	s.initSlots(m)
	m.NewGaugeFunc("floodgate_config_last_reload_success_timestamp_seconds", "When the rules in use were loaded.", func() float64 { return float64(s.lastOK.Load()) })
	m.NewGaugeFunc("floodgate_rules", "Rules in the current configuration.", func() float64 { return float64(len(s.Config().Rules)) })
	m.NewGaugeFunc("floodgate_fallback_degraded", "1 while the Redis store is failing and decisions follow the fallback policy, else 0.", func() float64 {
		if fb != nil && fb.State() == fallback.Degraded {
			return 1
		}
		return 0
	})
	m.NewCounterFunc("floodgate_fallback_switches_total", "Switches between Redis and the fallback policy.", func() uint64 {
		if fb == nil {
			return 0
		}
		return fb.Stats().Switches
	})
	m.NewCounterFunc("floodgate_fallback_decisions_total", "Decisions answered by the fallback policy.", func() uint64 {
		if fb == nil {
			return 0
		}
		return fb.Stats().Fallbacks
	})
	if mem := o.Memory; mem != nil {
		m.NewGaugeFunc("floodgate_memory_keys", "Keys held by the in-memory store.", func() float64 { return float64(mem.Len()) })
		m.NewGaugeFunc("floodgate_memory_bytes", "Memory the in-memory store's keys take, as its bound counts it.", func() float64 { return float64(mem.Bytes()) })
		m.NewCounterFunc("floodgate_memory_evictions_total", "Keys the in-memory store evicted before they were back to full, to stay within its bounds.", mem.Evictions)
	}
	return s, nil
}

// Config returns the rules in use.
func (s *Service) Config() *config.Config { return s.rules.Load().cfg }

// Prepared returns what Options.Prepare made of the rules in use, nil
// without it.
func (s *Service) Prepared() any { return s.rules.Load().prepared }

// Store returns the store the service decides on.
func (s *Service) Store() floodgate.Store { return s.store }

// ObserveStore records d, the time a store call took to decide, in the
// store latency histogram.
func (s *Service) ObserveStore(d time.Duration) { s.latency.Observe(d.Seconds()) }

// DecisionCounter returns the counter of rule's decisions with outcome
// ("allowed", "denied", ...) in floodgate_decisions_total, for a surface
// that counts its own (Envoy's, as rule "envoy"). Finding it joins its
// labels, so a caller on a hot path keeps it.
func (s *Service) DecisionCounter(rule, outcome string) *atomic.Uint64 {
	return s.decisions.With(rule, outcome)
}

// Reload loads the rules file at path and swaps it in. When the file is
// invalid it returns the error, logs it, counts it, and keeps the rules in
// use.
func (s *Service) Reload(path string) error {
	cfg, err := s.Load(path)
	return s.Apply(path, cfg, err)
}

// Load reads the rules file (or directory) at path as Reload does,
// without swapping it in.
func (s *Service) Load(path string) (*config.Config, error) { return config.LoadWith(path, s.load) }

// Apply is the end of Reload: it swaps in cfg, which Load read from path,
// or, when err is set, logs and counts the failure and keeps the rules in
// use. It returns err or the failure to prepare cfg.
func (s *Service) Apply(path string, cfg *config.Config, err error) error {
	ctx, span := s.startReload(path)
	defer span.End()
	var rs *ruleset
	if err == nil {
		rs, err = s.prepare(cfg)
	}
	if err != nil {
		s.reloads.Add(1, "failure")
		s.log.ErrorContext(ctx, "floodgate: rules file invalid; keeping the rules in use", "file", path, "error", err.Error())
		if span.IsRecording() {
			span.SetStatus(codes.Error, err.Error())
			span.SetAttributes(attribute.String("error.type", "invalid_rules"))
		}
		return err
	}
	span.SetAttributes(AttrRules.Int(len(cfg.Rules)))
	s.rules.Store(rs)
	s.reloads.Add(1, "success")
	s.lastOK.Store(time.Now().Unix())
	s.log.InfoContext(ctx, "floodgate: rules reloaded", "file", path, "rules", len(cfg.Rules))
	ctx, cancel := context.WithTimeout(ctx, RebaseTimeout)
	defer cancel()
	s.Rebase(ctx)
	return nil
}

// startReload starts the span of a reload of path: the root of a trace
// of its own, in which the rebase's calls to the store are.
func (s *Service) startReload(path string) (context.Context, trace.Span) {
	if s.tp == nil {
		return context.Background(), noSpan
	}
	return s.tp.Tracer(floodgate.TracerName).Start(context.Background(), SpanReload,
		trace.WithNewRoot(), trace.WithAttributes(AttrFile.String(path)))
}

// noSpan is the span of a reload that is not traced.
var noSpan = trace.SpanFromContext(context.Background())

// RebaseTimeout bounds the carrying of the keys of the rules that a reload
// changed (see Rebase).
const RebaseTimeout = 5 * time.Minute

// Rebase records every rule's limits as those of its keys in the store
// and, for a rule whose limits changed since they were last recorded (by
// this process or any other that shares the store, before a reload or a
// restart), carries each of its keys' usage to the new limits as the
// rule's on_change says. Reload calls it; floodgate serve also calls it
// once at start. It logs what it carried and returns the first error;
// a rule that fails does not stop the others.
func (s *Service) Rebase(ctx context.Context) error {
	var first error
	rs := s.rules.Load()
	for _, r := range rs.cfg.Rules {
		rr := rs.rules[r.Name]
		if rr == nil {
			continue
		}
		n, err := rr.lim.Rebase(ctx, rr.prefix, r.OnChange)
		switch {
		case err != nil:
			s.log.Warn("floodgate: could not carry the keys of a changed rule to its new limits", "rule", r.Name, "carried", n, "error", err.Error())
			if first == nil {
				first = err
			}
		case n > 0:
			s.log.Info("floodgate: rule's limits changed; keys carried to them", "rule", r.Name, "keys", n, "on_change", r.OnChange.String())
		}
	}
	return first
}

// ReloadCount returns how many reloads succeeded and failed.
func (s *Service) ReloadCount() (ok, failed uint64) {
	return s.reloads.Get("success"), s.reloads.Get("failure")
}

func checkKey(key string) error {
	switch {
	case key == "":
		return fmt.Errorf("%w: empty key", ErrBadRequest)
	case len(key) > MaxKeyLen:
		return fmt.Errorf("%w: key is %d bytes, more than the maximum %d", ErrBadRequest, len(key), MaxKeyLen)
	}
	return nil
}

// ruleKey is the store key of a client's key under a rule:
// "r<length of rule>:<rule>:<key>". The rule's length makes it
// unambiguous: rule "a" with key "b:c" and rule "a:b" with key "c" are
// "r1:a:b:c" and "r3:a:b:c". CL.THROTTLE's keys start with "cell:", which
// no rule key does.
func ruleKey(rule, key string) string {
	return "r" + strconv.Itoa(len(rule)) + ":" + rule + ":" + key
}

// Check decides a request of cost on key under the rule called rule.
func (s *Service) Check(ctx context.Context, rule, key string, cost int64) (Decision, error) {
	r, ok := s.rules.Load().rules[rule]
	if !ok {
		return Decision{}, fmt.Errorf("%w %q", ErrUnknownRule, rule)
	}
	if err := checkKey(key); err != nil {
		return Decision{}, err
	}
	if cost < 0 {
		return Decision{}, fmt.Errorf("%w: cost must not be negative, got %d", ErrBadRequest, cost)
	}
	res, err := s.take(ctx, r.lim, r.prefix+key, cost)
	if err != nil {
		s.decisions.Add(1, rule, "error")
		s.KeyFailed(rule, err)
		return Decision{}, err
	}
	d := Decision{Rule: rule, Shadow: r.Shadow, Allowed: res.Allowed || r.Shadow, Result: res, Limit: res.Name, Limits: r.Limits}
	switch {
	case res.Allowed:
		s.decisions.Add(1, rule, "allowed")
	case r.Shadow:
		s.decisions.Add(1, rule, "shadow_denied")
		s.denied(rule, key)
	default:
		s.decisions.Add(1, rule, "denied")
		s.denied(rule, key)
	}
	return d, nil
}

// Denied reports a denial that another surface decided (package envoy's,
// as rule "envoy:<domain>") to Options.OnDenied, so that the dashboard's
// top keys see it; it does nothing without OnDenied.
func (s *Service) Denied(rule, key string) { s.denied(rule, key) }

func (s *Service) denied(rule, key string) {
	if s.onDenied != nil {
		s.onDenied(rule, key)
	}
}

// Peek reports key's state under rule, as a check of cost 0 would, but is
// not counted as a decision: it is for looking, not traffic.
func (s *Service) Peek(ctx context.Context, rule, key string) (Decision, error) {
	r, ok := s.rules.Load().rules[rule]
	if !ok {
		return Decision{}, fmt.Errorf("%w %q", ErrUnknownRule, rule)
	}
	if err := checkKey(key); err != nil {
		return Decision{}, err
	}
	res, err := r.lim.Peek(ctx, r.prefix+key)
	if err != nil {
		s.KeyFailed(rule, err)
		return Decision{}, err
	}
	return Decision{Rule: rule, Shadow: r.Shadow, Allowed: true, Result: res, Limit: res.Name}, nil
}

// Decisions returns how many checks of rule ("CL.THROTTLE" for those)
// were allowed and denied since start; a shadow rule's denials count as
// denied.
func (s *Service) Decisions(rule string) (allowed, denied uint64) {
	return s.decisions.Get(rule, "allowed"), s.decisions.Get(rule, "denied") + s.decisions.Get(rule, "shadow_denied")
}

// Latency returns the store latency histogram's bounds (seconds), counts
// per bucket (the last is +Inf) and sum in microseconds since start.
func (s *Service) Latency() (bounds []float64, counts []uint64, sumMicros uint64) {
	return s.latency.Snapshot()
}

// Fallback returns the fallback store in front of Redis, or nil.
func (s *Service) Fallback() *fallback.Store { return s.fallback }

func (s *Service) take(ctx context.Context, lim *floodgate.Limiter, key string, n int64) (floodgate.Result, error) {
	start := time.Now()
	res, err := lim.AllowN(ctx, key, n)
	s.latency.Observe(time.Since(start).Seconds())
	return res, err
}

// Settle corrects the cost of a request that was checked with an
// estimate: it was charged charged, it really cost cost. The difference is
// refunded or charged (floodgate.Limiter.Settle), even into debt, so that
// later requests wait. The Decision is allowed and reports the state
// after. A shadow rule is settled too: its counts stay true.
func (s *Service) Settle(ctx context.Context, rule, key string, charged, cost int64) (Decision, error) {
	r, ok := s.rules.Load().rules[rule]
	if !ok {
		return Decision{}, fmt.Errorf("%w %q", ErrUnknownRule, rule)
	}
	if err := checkKey(key); err != nil {
		return Decision{}, err
	}
	if charged < 0 || cost < 0 {
		return Decision{}, fmt.Errorf("%w: charged and cost must not be negative, got %d and %d", ErrBadRequest, charged, cost)
	}
	res, err := r.lim.Settle(ctx, r.prefix+key, charged, cost)
	if err != nil {
		s.KeyFailed(rule, err)
		return Decision{}, err
	}
	return Decision{Rule: rule, Shadow: r.Shadow, Allowed: true, Result: res, Limit: res.Name}, nil
}

// Reset refills key under rule.
func (s *Service) Reset(ctx context.Context, rule, key string) error {
	r, ok := s.rules.Load().rules[rule]
	if !ok {
		return fmt.Errorf("%w %q", ErrUnknownRule, rule)
	}
	if err := checkKey(key); err != nil {
		return err
	}
	return r.lim.Reset(ctx, r.prefix+key)
}

// Throttle is redis-cell's CL.THROTTLE: a GCRA limit of count per period
// seconds with bursts of maxBurst, on key, for a request of quantity. Its
// keys are apart from the rules' keys.
func (s *Service) Throttle(ctx context.Context, key string, maxBurst, count, period, quantity int64) (floodgate.Result, error) {
	if err := checkKey(key); err != nil {
		return floodgate.Result{}, err
	}
	if period < 1 || period > int64(floodgate.MaxPeriod/time.Second) {
		return floodgate.Result{}, fmt.Errorf("%w: period must be from 1 to %d seconds, got %d", ErrBadRequest, int64(floodgate.MaxPeriod/time.Second), period)
	}
	if quantity < 0 {
		return floodgate.Result{}, fmt.Errorf("%w: quantity must not be negative, got %d", ErrBadRequest, quantity)
	}
	// Each call names its own limit, so it is prepared for this call.
	lim, err := floodgate.NewLimiter(s.store, []floodgate.Limit{floodgate.GCRA(maxBurst, count, time.Duration(period)*time.Second)}, s.LimiterOptions("CL.THROTTLE"))
	if err != nil {
		if floodgate.IsInvalidInput(err) {
			return floodgate.Result{}, fmt.Errorf("%w: %w", ErrBadRequest, err)
		}
		return floodgate.Result{}, err
	}
	res, err := s.take(ctx, lim, "cell:"+key, quantity)
	outcome := "allowed"
	switch {
	case err != nil:
		outcome = "error"
		s.KeyFailed("CL.THROTTLE", err)
	case !res.Allowed:
		outcome = "denied"
	}
	s.decisions.Add(1, "CL.THROTTLE", outcome)
	if outcome == "denied" {
		s.denied("CL.THROTTLE", key)
	}
	return res, err
}

// KeyFailed counts and logs err, a call's failure under rule, when it is
// an error about its key alone (floodgate.ErrKey): Redis works, so the
// fallback does not hear of it, and an operator must. The log has a line
// a second at most, since a client may retry such a key without end.
func (s *Service) KeyFailed(rule string, err error) {
	if !errors.Is(err, floodgate.ErrKey) {
		return
	}
	kind := KeyErrorKind(err)
	s.keyErrors.Add(1, rule, kind)
	if held, ok := s.keyLog.Allow(); ok {
		s.log.Warn("floodgate: a key failed on its own; Redis works for the others", "rule", rule, "kind", kind, "error", err.Error(), "suppressed", held)
	}
}

// KeyErrorKind names the kind of an error about one key
// (floodgate.ErrKey), as the floodgate_key_errors_total metric labels
// it: "noperm" for an ACL's refusal, "wrong_type" for a Redis key of
// another type, "corrupt" for data that is not floodgate's. A fixed set,
// so that the metric's labels stay few.
func KeyErrorKind(err error) string {
	msg := err.Error()
	switch {
	case strings.Contains(msg, "NOPERM"):
		return "noperm"
	case strings.Contains(msg, "wrong type"), strings.Contains(msg, "WRONGTYPE"):
		return "wrong_type"
	}
	return "corrupt"
}

// Ready reports whether decisions are being made by the configured store
// (true), or by the fallback policy while Redis fails (false).
func (s *Service) Ready() bool {
	return s.fallback == nil || s.fallback.State() == fallback.Primary
}
