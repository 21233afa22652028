package envoy

// envoyproxy/ratelimit's per-descriptor statistics, as Prometheus
// metrics with bounded labels.

import (
	"regexp"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/floodgate/floodgate/internal/server/metrics"
	"github.com/floodgate/floodgate/internal/server/statsd"
)

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
	// sink, when set, gets the same counts under envoyproxy/ratelimit's
	// StatsD names: the whole descriptor name, not two labels.
	sink *statsd.Sink
}

// envoyStat is one descriptor name's labels and, once used, its counters,
// kept so that counting does not join the labels again.
type envoyStat struct {
	labels [3]string
	counts [numEnvoyStats]atomic.Pointer[atomic.Uint64]
	// sd are the StatsD counters, when the metrics have a sink.
	sd [numEnvoyStats]*statsd.Counter
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

func newEnvoyMetrics(r *metrics.Registry, sink *statsd.Sink) *envoyMetrics {
	m := &envoyMetrics{sink: sink}
	m.overflow.labels = [3]string{"", "overflow", ""}
	m.statsdCounters(&m.overflow, "overflow")
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
	st.sd[kind].Add(n)
}

// StatsDPrefix is the scope of envoyproxy/ratelimit's per-descriptor
// statistics: a descriptor's are StatsDPrefix + its name + "." + the
// statistic (total_hits, over_limit, near_limit, within_limit,
// shadow_mode).
const StatsDPrefix = "ratelimit.service.rate_limit."

// statsdCounters sets st's StatsD counters, for the descriptor name
// clean, when the metrics have a sink.
func (m *envoyMetrics) statsdCounters(st *envoyStat, clean string) {
	if m.sink == nil {
		return
	}
	for kind, name := range envoyStatNames {
		st.sd[kind] = m.sink.Counter(StatsDPrefix + clean + "." + name)
		if st.sd[kind] == nil && st != &m.overflow {
			// The sink keeps fewer names than maxEnvoyStats descriptors
			// have counters: past its bound the hits count as overflow,
			// not under no name at all.
			st.sd[kind] = m.overflow.sd[kind]
		}
	}
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
	m.statsdCounters(st, clean)
	v, loaded := m.names.LoadOrStore(stat, st)
	if loaded {
		m.n.Add(-1) // another caller kept it first
	}
	return v.(*envoyStat)
}
