// Package metrics keeps counters, gauges and histograms and writes them in
// the Prometheus text exposition format (version 0.0.4). It is the small
// part of a Prometheus client that floodgate serve needs, without the
// dependency.
package metrics

import (
	"fmt"
	"io"
	"math"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
)

// Registry holds metrics and writes them in the order they were made.
type Registry struct {
	mu      sync.Mutex
	metrics []metric
}

type metric interface {
	write(w io.Writer)
}

// Write writes every metric in the text format.
func (r *Registry) Write(w io.Writer) {
	r.mu.Lock()
	ms := append([]metric(nil), r.metrics...)
	r.mu.Unlock()
	for _, m := range ms {
		m.write(w)
	}
}

func (r *Registry) add(m metric) {
	r.mu.Lock()
	r.metrics = append(r.metrics, m)
	r.mu.Unlock()
}

func header(w io.Writer, name, help, typ string) {
	fmt.Fprintf(w, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, typ)
}

// CounterVec is a counter with labels.
type CounterVec struct {
	name, help string
	labels     []string
	values     sync.Map // joined label values -> *atomic.Uint64
}

// NewCounterVec registers a counter with the given label names.
func (r *Registry) NewCounterVec(name, help string, labels ...string) *CounterVec {
	c := &CounterVec{name: name, help: help, labels: labels}
	r.add(c)
	return c
}

// Add adds n to the counter with the given label values.
func (c *CounterVec) Add(n uint64, values ...string) { c.With(values...).Add(n) }

// With returns the counter with the given label values, made on first
// use. A caller that counts under the same values often keeps it and adds
// to it, which saves joining the values on every Add.
func (c *CounterVec) With(values ...string) *atomic.Uint64 {
	k := strings.Join(values, "\x00")
	v, ok := c.values.Load(k)
	if !ok {
		v, _ = c.values.LoadOrStore(k, new(atomic.Uint64))
	}
	return v.(*atomic.Uint64)
}

// Get returns the counter's value for the label values.
func (c *CounterVec) Get(values ...string) uint64 {
	if v, ok := c.values.Load(strings.Join(values, "\x00")); ok {
		return v.(*atomic.Uint64).Load()
	}
	return 0
}

func (c *CounterVec) write(w io.Writer) {
	header(w, c.name, c.help, "counter")
	var keys []string
	c.values.Range(func(k, _ any) bool { keys = append(keys, k.(string)); return true })
	sort.Strings(keys)
	for _, k := range keys {
		v, _ := c.values.Load(k)
		fmt.Fprintf(w, "%s%s %d\n", c.name, labelString(c.labels, strings.Split(k, "\x00")), v.(*atomic.Uint64).Load())
	}
}

func labelString(names, values []string) string {
	if len(names) == 0 {
		return ""
	}
	var b strings.Builder
	b.WriteByte('{')
	for i, n := range names {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(n)
		b.WriteString(`="`)
		v := ""
		if i < len(values) {
			v = values[i]
		}
		b.WriteString(strings.NewReplacer(`\`, `\\`, `"`, `\"`, "\n", `\n`).Replace(v))
		b.WriteByte('"')
	}
	b.WriteByte('}')
	return b.String()
}

// funcMetric is a gauge or counter whose value is read when the metrics
// are written.
type funcMetric struct {
	name, help, typ string
	f               func() float64
}

// NewGaugeFunc registers a gauge that calls f for its value.
func (r *Registry) NewGaugeFunc(name, help string, f func() float64) {
	r.add(&funcMetric{name: name, help: help, typ: "gauge", f: f})
}

// NewCounterFunc registers a counter that calls f for its value.
func (r *Registry) NewCounterFunc(name, help string, f func() uint64) {
	r.add(&funcMetric{name: name, help: help, typ: "counter", f: func() float64 { return float64(f()) }})
}

func (m *funcMetric) write(w io.Writer) {
	header(w, m.name, m.help, m.typ)
	fmt.Fprintf(w, "%s %s\n", m.name, formatFloat(m.f()))
}

// Labeled is one series of a GaugeVecFunc: its label values, in the order
// of the labels, and its value.
type Labeled struct {
	Values []string
	Value  float64
}

// gaugeVecFunc is a gauge with labels whose series are read when the
// metrics are written.
type gaugeVecFunc struct {
	name, help string
	labels     []string
	f          func() []Labeled
}

// NewGaugeVecFunc registers a gauge with the given label names that calls
// f for its series, written in the order of their label values.
func (r *Registry) NewGaugeVecFunc(name, help string, labels []string, f func() []Labeled) {
	r.add(&gaugeVecFunc{name: name, help: help, labels: labels, f: f})
}

func (g *gaugeVecFunc) write(w io.Writer) {
	header(w, g.name, g.help, "gauge")
	series := g.f()
	sort.Slice(series, func(i, j int) bool {
		return strings.Join(series[i].Values, "\x00") < strings.Join(series[j].Values, "\x00")
	})
	for _, s := range series {
		fmt.Fprintf(w, "%s%s %s\n", g.name, labelString(g.labels, s.Values), formatFloat(s.Value))
	}
}

// Histogram counts observations in cumulative buckets.
type Histogram struct {
	name, help string
	bounds     []float64
	counts     []atomic.Uint64 // one per bound, plus +Inf
	sumMicros  atomic.Uint64   // the sum in microseconds, to stay atomic
}

// NewHistogram registers a histogram of seconds with the given upper
// bounds, in increasing order.
func (r *Registry) NewHistogram(name, help string, bounds []float64) *Histogram {
	h := &Histogram{name: name, help: help, bounds: bounds, counts: make([]atomic.Uint64, len(bounds)+1)}
	r.add(h)
	return h
}

// Observe records a value in seconds.
func (h *Histogram) Observe(seconds float64) {
	i := sort.SearchFloat64s(h.bounds, seconds)
	h.counts[i].Add(1)
	h.sumMicros.Add(uint64(math.Max(0, seconds*1e6)))
}

// Snapshot returns the histogram's upper bounds, its count per bucket
// (one more than bounds: the last is +Inf) and the sum of its values in
// microseconds.
func (h *Histogram) Snapshot() (bounds []float64, counts []uint64, sumMicros uint64) {
	counts = make([]uint64, len(h.counts))
	for i := range h.counts {
		counts[i] = h.counts[i].Load()
	}
	return h.bounds, counts, h.sumMicros.Load()
}

func (h *Histogram) write(w io.Writer) {
	header(w, h.name, h.help, "histogram")
	var total uint64
	for i, b := range h.bounds {
		total += h.counts[i].Load()
		fmt.Fprintf(w, "%s_bucket{le=\"%s\"} %d\n", h.name, formatFloat(b), total)
	}
	total += h.counts[len(h.bounds)].Load()
	fmt.Fprintf(w, "%s_bucket{le=\"+Inf\"} %d\n", h.name, total)
	fmt.Fprintf(w, "%s_sum %s\n", h.name, formatFloat(float64(h.sumMicros.Load())/1e6))
	fmt.Fprintf(w, "%s_count %d\n", h.name, total)
}

func formatFloat(f float64) string { return strconv.FormatFloat(f, 'g', -1, 64) }
