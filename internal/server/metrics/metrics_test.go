package metrics

import (
	"strings"
	"testing"
)

func TestWrite(t *testing.T) {
	var r Registry
	c := r.NewCounterVec("x_total", "Xs.", "rule", "outcome")
	c.Add(2, "a", "allowed")
	c.Add(1, `q"uote`, "denied")
	r.NewGaugeFunc("g", "A gauge.", func() float64 { return 0.5 })
	r.NewCounterFunc("n_total", "A counter.", func() uint64 { return 7 })
	r.NewGaugeVecFunc("p_info", "Labeled.", []string{"policy"}, func() []Labeled {
		return []Labeled{{[]string{"b"}, 2}, {[]string{"a"}, 1}}
	})
	h := r.NewHistogram("lat_seconds", "Latency.", []float64{0.001, 0.01})
	h.Observe(0.0005)
	h.Observe(0.001)
	h.Observe(0.5)
	var b strings.Builder
	r.Write(&b)
	want := `# HELP x_total Xs.
# TYPE x_total counter
x_total{rule="a",outcome="allowed"} 2
x_total{rule="q\"uote",outcome="denied"} 1
# HELP g A gauge.
# TYPE g gauge
g 0.5
# HELP n_total A counter.
# TYPE n_total counter
n_total 7
# HELP p_info Labeled.
# TYPE p_info gauge
p_info{policy="a"} 1
p_info{policy="b"} 2
# HELP lat_seconds Latency.
# TYPE lat_seconds histogram
lat_seconds_bucket{le="0.001"} 2
lat_seconds_bucket{le="0.01"} 2
lat_seconds_bucket{le="+Inf"} 3
lat_seconds_sum 0.5015
lat_seconds_count 3
`
	if b.String() != want {
		t.Errorf("got:\n%s\nwant:\n%s", b.String(), want)
	}
	if c.Get("a", "allowed") != 2 || c.Get("none") != 0 {
		t.Error("Get")
	}
}
