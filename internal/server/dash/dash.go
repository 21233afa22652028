// Package dash is the live dashboard of floodgate serve: one page, at
// /ui/ on the HTTP listener, that shows what is being limited, who, and
// whether the store is healthy.
//
// It costs the decision path nothing but what the service already counts:
// a sampler goroutine reads the service's cumulative counters every Step
// and keeps the last Window of them, per rule, in fixed rings. The only
// work per decision is on a denial, which counts the denied key in a
// bounded heavy-hitters sketch (see topKeys), and on a granted acquire of
// a concurrency rule, which counts its key in another. Nothing is
// computed for the page until it asks; then it looks at the slots held by
// a bounded few of the keys that acquired most (Snapshot.Concurrency).
package dash

import (
	"context"
	"embed"
	"io/fs"
	"net/http"
	"sort"
	"sync"
	"time"

	"github.com/floodgate/floodgate/fallback"
	"github.com/floodgate/floodgate/internal/server/config"
	"github.com/floodgate/floodgate/internal/server/service"
)

//go:embed ui
var assets embed.FS

// Options configures a Dashboard. The zero value (or nil) gives the
// defaults.
type Options struct {
	// Store describes the store in use, as floodgate serve prints it.
	Store string
	// Step is how often the counters are sampled: the chart's resolution.
	// Default: 2 seconds.
	Step time.Duration
	// Window is how much history the chart keeps. Default: 15 minutes.
	Window time.Duration
	// TopWindow is how long a window of the top-keys sketch lasts; a report
	// covers the current and the previous one. Default: 5 minutes.
	TopWindow time.Duration
	// TopCounters is the size of the top-keys sketch: the most (rule, key)
	// pairs it counts, whatever the traffic. Default: 1,024.
	TopCounters int
	// Redis, when set, returns what is known of the Redis servers, read
	// when the page asks. Default: nil, the page shows no Redis servers.
	Redis func() Redis
	// Domains, when set, returns the Envoy domains in use, read when the
	// page asks. Default: nil, the page shows no domains.
	Domains func() []Domain
}

// Domain is what the page shows of an Envoy domain, beside the rules.
// Its denials are in the top keys as rule "envoy:<domain>".
type Domain struct {
	Name string `json:"name"`
	// Descriptors counts the domain's descriptors that have a limit.
	Descriptors int `json:"descriptors"`
	// Hits and OverLimit are the domain's descriptors' hits, and those
	// over their limit, since the service started (envoyproxy/ratelimit's
	// total_hits and over_limit statistics).
	Hits      uint64 `json:"hits"`
	OverLimit uint64 `json:"over_limit"`
}

// Redis is what the page shows of the Redis servers: what gives limits
// back without an error.
type Redis struct {
	// Policies are the masters' maxmemory-policy values, sorted
	// ("unknown" for one that could not be read).
	Policies []string `json:"maxmemory_policies"`
	// Evicts is set when a policy evicts limits' keys.
	Evicts bool `json:"evicts"`
	// EvictedKeys is the keys the masters evicted, all of them, not only
	// floodgate's.
	EvictedKeys uint64 `json:"evicted_keys"`
	// Restarts counts the masters' restarts (run_id changes) seen.
	Restarts uint64 `json:"restarts"`
}

// Dashboard collects what the page shows. Make one with New; Close stops
// its sampler. It is safe for concurrent use.
type Dashboard struct {
	svc *service.Service
	o   Options
	top *topKeys
	// holders counts the granted acquires per concurrency rule and key,
	// as top counts denials.
	holders *topKeys
	n       int // points per ring

	mu      sync.Mutex
	times   []int64 // unix ms of each sample, a ring of n
	next    int     // where the next sample goes
	filled  int     // samples held, up to n
	rules   map[string]*ruleSeries
	latency latencySeries
	events  []Event // switches to and from the fallback, oldest first

	stop      chan struct{}
	done      chan struct{}
	closeOnce sync.Once
}

type ruleSeries struct {
	allowed, denied []float32 // per second, a ring aligned with times
	lastA, lastD    uint64    // the cumulative counts at the last sample
}

type latencySeries struct {
	p50, p99, mean []float32 // milliseconds, a ring aligned with times
	lastCounts     []uint64
	lastSum        uint64
}

// Event is a switch of the store to or from the fallback.
type Event struct {
	At    int64  `json:"at"` // unix ms
	State string `json:"state"`
}

// maxEvents bounds the switches kept.
const maxEvents = 200

// New returns a Dashboard over svc and starts its sampler.
func New(svc *service.Service, opts *Options) *Dashboard {
	var o Options
	if opts != nil {
		o = *opts
	}
	if o.Step <= 0 {
		o.Step = 2 * time.Second
	}
	if o.Window <= 0 {
		o.Window = 15 * time.Minute
	}
	if o.TopWindow <= 0 {
		o.TopWindow = 5 * time.Minute
	}
	if o.TopCounters <= 0 {
		o.TopCounters = 1024
	}
	n := max(2, int(o.Window/o.Step))
	d := &Dashboard{svc: svc, o: o, top: newTopKeys(o.TopCounters), holders: newTopKeys(o.TopCounters), n: n, times: make([]int64, n),
		rules: map[string]*ruleSeries{}, stop: make(chan struct{}), done: make(chan struct{})}
	d.latency = latencySeries{p50: make([]float32, n), p99: make([]float32, n), mean: make([]float32, n)}
	d.sample(time.Now(), true)
	go d.run()
	return d
}

// Denied counts a denial of key under rule; give it to service.Options
// as OnDenied.
func (d *Dashboard) Denied(rule, key string) { d.top.Add(rule, key) }

// Acquired counts a granted acquire of key under the concurrency rule
// rule; give it to service.Options as OnAcquired.
func (d *Dashboard) Acquired(rule, key string) { d.holders.Add(rule, key) }

// Switched records a switch of the fallback store; give it to
// fallback.Options as OnSwitch.
func (d *Dashboard) Switched(s fallback.State) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if len(d.events) == maxEvents {
		d.events = append(d.events[:0], d.events[1:]...)
	}
	d.events = append(d.events, Event{At: time.Now().UnixMilli(), State: s.String()})
}

// Close stops the sampler. It is safe to call more than once.
func (d *Dashboard) Close() {
	d.closeOnce.Do(func() { close(d.stop) })
	<-d.done
}

func (d *Dashboard) run() {
	defer close(d.done)
	tick := time.NewTicker(d.o.Step)
	defer tick.Stop()
	rotate := time.NewTicker(d.o.TopWindow)
	defer rotate.Stop()
	for {
		select {
		case <-d.stop:
			return
		case now := <-tick.C:
			d.sample(now, false)
		case <-rotate.C:
			d.top.rotate()
			d.holders.rotate()
		}
	}
}

// sample reads the service's counters at now and appends their rates
// since the last sample; the first sample only records the counts.
func (d *Dashboard) sample(now time.Time, first bool) {
	secs := float32(d.o.Step.Seconds())
	bounds, counts, sum := d.svc.Latency()
	names := []string{"CL.THROTTLE"}
	for _, r := range d.svc.Config().Rules {
		names = append(names, r.Name)
	}

	d.mu.Lock()
	defer d.mu.Unlock()
	i := d.next
	if !first {
		d.times[i] = now.UnixMilli()
		d.next = (i + 1) % d.n
		d.filled = min(d.filled+1, d.n)
	}
	seen := make(map[string]bool, len(names))
	for _, name := range names {
		seen[name] = true
		a, dn := d.svc.Decisions(name)
		rs := d.rules[name]
		if rs == nil {
			rs = &ruleSeries{allowed: make([]float32, d.n), denied: make([]float32, d.n)}
			d.rules[name] = rs
		} else if !first {
			rs.allowed[i] = float32(a-rs.lastA) / secs
			rs.denied[i] = float32(dn-rs.lastD) / secs
		}
		rs.lastA, rs.lastD = a, dn
	}
	for name := range d.rules {
		if !seen[name] {
			delete(d.rules, name) // gone in a reload
		}
	}
	l := &d.latency
	if !first && l.lastCounts != nil {
		delta := make([]uint64, len(counts))
		var total uint64
		for j := range counts {
			delta[j] = counts[j] - l.lastCounts[j]
			total += delta[j]
		}
		l.p50[i], l.p99[i], l.mean[i] = 0, 0, 0
		if total > 0 {
			l.p50[i] = quantile(bounds, delta, total, 0.50)
			l.p99[i] = quantile(bounds, delta, total, 0.99)
			l.mean[i] = float32(sum-l.lastSum) / float32(total) / 1000
		}
	}
	l.lastCounts, l.lastSum = counts, sum
}

// quantile returns the upper bound, in milliseconds, of the bucket that
// holds quantile q of a histogram's counts (the last bound for +Inf).
func quantile(bounds []float64, counts []uint64, total uint64, q float64) float32 {
	want := uint64(q*float64(total) + 0.5)
	var seen uint64
	for j, c := range counts {
		seen += c
		if seen >= max(want, 1) {
			if j >= len(bounds) {
				j = len(bounds) - 1
			}
			return float32(bounds[j] * 1000)
		}
	}
	return float32(bounds[len(bounds)-1] * 1000)
}

// Snapshot is what the page shows, as GET /v1/dashboard sends it.
type Snapshot struct {
	Now   int64  `json:"now"` // unix ms
	Step  int64  `json:"step_ms"`
	Store Store  `json:"store"`
	Rules []Rule `json:"rules"`
	// Domains are the Envoy domains, sorted by name; empty without any.
	Domains []Domain            `json:"domains"`
	Times   []int64             `json:"times"` // unix ms of the samples, oldest first
	Series  map[string]Series   `json:"series"`
	Top     map[string][]TopKey `json:"top"` // per rule, the keys denied most in the last TopWindow or two
	TopErr  uint64              `json:"top_error_bound"`
	// Concurrency are the concurrency rules, sorted by name, each with
	// the keys that acquired most through this instance; their denials
	// are in Top under the rule's name.
	Concurrency []SlotRule `json:"concurrency"`
	// HoldersErr bounds the error of a holder's Acquires, as TopErr does.
	HoldersErr uint64 `json:"holders_error_bound"`
}

// SlotRule is what the page shows of a concurrency rule.
type SlotRule struct {
	Name    string   `json:"name"`
	Slots   int64    `json:"slots"`
	LeaseMs int64    `json:"lease_ms"`
	Rates   []string `json:"rates,omitempty"` // the rate rules decided with it
	// Holders are the keys that acquired most through this instance in
	// the last TopWindow or two, most first, each with its slots held now
	// across every instance, read from the store (service.Explain) when
	// the page asks.
	Holders []Holder `json:"holders"`
}

// Holder is a key of a concurrency rule that acquired often.
type Holder struct {
	Key string `json:"key"`
	// Acquires counts its granted acquires through this instance, at most
	// Error more than the truth.
	Acquires uint64 `json:"acquires"`
	Error    uint64 `json:"error"`
	// Held is how many of its slots are held now, by every instance; -1
	// when the store could not tell (an error, or the page's budget of
	// looks spent).
	Held int64 `json:"held"`
	// FreeInMs is the time until its earliest permit expires; null when
	// none is held or Held is -1.
	FreeInMs *int64 `json:"free_in_ms"`
}

// The bounds on the looks at the store that a snapshot takes: the
// holders shown per rule, the looks in all, and their time.
const (
	holdersPerRule = 5
	maxHolderLooks = 20
	holderLookTime = time.Second
)

// Store is the store's health.
type Store struct {
	Name  string `json:"name"`
	State string `json:"state"` // "primary", or "degraded" while the fallback answers
	// The store's latency per sample, in milliseconds: the median and the
	// 99th percentile as the upper bound of their histogram bucket, and
	// the mean; aligned with Snapshot.Times.
	P50    []float32 `json:"latency_p50_ms"`
	P99    []float32 `json:"latency_p99_ms"`
	Mean   []float32 `json:"latency_mean_ms"`
	Events []Event   `json:"events"` // switches to and from the fallback
	// Redis is the Redis servers' eviction policy, evictions and
	// restarts; nil without Redis.
	Redis *Redis `json:"redis,omitempty"`
}

// Rule describes a rule.
type Rule struct {
	Name   string   `json:"name"`
	Shadow bool     `json:"shadow,omitempty"`
	Limits []string `json:"limits"`
}

// Series are a rule's decisions per second, aligned with Snapshot.Times.
type Series struct {
	Allowed []float32 `json:"allowed"`
	Denied  []float32 `json:"denied"`
}

// Snapshot returns what the page shows now.
func (d *Dashboard) Snapshot() Snapshot {
	cfg := d.svc.Config()
	s := Snapshot{Now: time.Now().UnixMilli(), Step: d.o.Step.Milliseconds(), Series: map[string]Series{}, Store: Store{Name: d.o.Store, State: "primary"}}
	for _, r := range cfg.Rules {
		rr := Rule{Name: r.Name, Shadow: r.Shadow}
		for _, l := range r.Limits {
			rr.Limits = append(rr.Limits, l.String())
		}
		s.Rules = append(s.Rules, rr)
	}
	if fb := d.svc.Fallback(); fb != nil {
		s.Store.State = fb.State().String()
	}
	s.Domains = []Domain{}
	if d.o.Domains != nil {
		s.Domains = append(s.Domains, d.o.Domains()...)
	}
	if d.o.Redis != nil {
		r := d.o.Redis()
		s.Store.Redis = &r
	}
	top, topErr := d.top.Top(10)
	d.mu.Lock()
	order := func(ring []float32) []float32 {
		out := make([]float32, 0, d.filled)
		for k := range d.filled {
			out = append(out, ring[(d.next-d.filled+k+d.n)%d.n])
		}
		return out
	}
	for k := range d.filled {
		s.Times = append(s.Times, d.times[(d.next-d.filled+k+d.n)%d.n])
	}
	for name, rs := range d.rules {
		a, dn := order(rs.allowed), order(rs.denied)
		if name == "CL.THROTTLE" && isZero(a) && isZero(dn) {
			continue // no CL.THROTTLE traffic: not worth a line
		}
		s.Series[name] = Series{Allowed: a, Denied: dn}
	}
	s.Store.P50, s.Store.P99, s.Store.Mean = order(d.latency.p50), order(d.latency.p99), order(d.latency.mean)
	s.Store.Events = append([]Event{}, d.events...)
	d.mu.Unlock()
	s.Top, s.TopErr = top, topErr
	s.Concurrency, s.HoldersErr = d.slotRules(cfg)
	sort.Slice(s.Rules, func(i, j int) bool { return s.Rules[i].Name < s.Rules[j].Name })
	return s
}

// slotRules describes cfg's concurrency rules and their top holders,
// looking at the store for at most maxHolderLooks of them within
// holderLookTime: what a page costs the store is bounded, whatever the
// rules and keys.
func (d *Dashboard) slotRules(cfg *config.Config) ([]SlotRule, uint64) {
	out := []SlotRule{}
	if len(cfg.Concurrency) == 0 {
		return out, 0
	}
	top, bound := d.holders.Top(holdersPerRule)
	ctx, cancel := context.WithTimeout(context.Background(), holderLookTime)
	defer cancel()
	looks := 0
	for _, sl := range cfg.Concurrency {
		r := SlotRule{Name: sl.Name, Slots: sl.Slots, LeaseMs: sl.Lease.Milliseconds(), Rates: sl.Rules, Holders: []Holder{}}
		for _, k := range top[sl.Name] {
			h := Holder{Key: k.Key, Acquires: k.Count, Error: k.Error, Held: -1}
			if looks < maxHolderLooks && ctx.Err() == nil {
				looks++
				if e, err := d.svc.Explain(ctx, sl.Name, k.Key); err == nil && e.Concurrency != nil {
					h.Held, h.FreeInMs = e.Concurrency.Held, e.Concurrency.FreeInMs
				}
			}
			r.Holders = append(r.Holders, h)
		}
		out = append(out, r)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, bound
}

func isZero(v []float32) bool {
	for _, x := range v {
		if x != 0 {
			return false
		}
	}
	return true
}

// Assets returns the page's files: index.html, its script and style, and
// the vendored uPlot.
func Assets() http.Handler {
	sub, _ := fs.Sub(assets, "ui")
	return http.FileServerFS(sub)
}
