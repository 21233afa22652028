package envoy

import (
	"bytes"
	"fmt"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/floodgate/floodgate/internal/server/metrics"
	"github.com/floodgate/floodgate/internal/server/statsd"
)

// TestEnvoyStatsBounded: descriptor names made of request values (a
// detailed_metric on a client's address) keep at most maxEnvoyStats names
// and label sets, however many clients come, and none longer than
// maxEnvoyStatLen; the rest count under key1="overflow". Until then every
// name past the bound was still kept to find its overflow counter: memory
// for each client address ever seen.
func TestEnvoyStatsBounded(t *testing.T) {
	r := &metrics.Registry{}
	m := newEnvoyMetrics(r, nil)
	const extra = 5000
	var wg sync.WaitGroup
	for g := range 4 { // concurrently, as requests count them
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := g; i < maxEnvoyStats+extra; i += 4 {
				m.Add(1, totalHits, fmt.Sprintf("edge.remote_address_10.%d.%d.%d", i>>16, i>>8&255, i&255))
			}
		}()
	}
	wg.Wait()
	m.Add(1, totalHits, "edge.path_"+strings.Repeat("x", maxEnvoyStatLen))
	kept := 0
	m.names.Range(func(_, _ any) bool { kept++; return true })
	if kept != maxEnvoyStats || m.n.Load() != maxEnvoyStats {
		t.Errorf("%d names kept (count %d), want %d", kept, m.n.Load(), maxEnvoyStats)
	}
	var out bytes.Buffer
	r.Write(&out)
	series := strings.Count(out.String(), "ratelimit_service_rate_limit_total_hits{")
	want := fmt.Sprintf(`ratelimit_service_rate_limit_total_hits{domain="",key1="overflow",key2=""} %d`, extra+1)
	if series != maxEnvoyStats+1 || !strings.Contains(out.String(), want) {
		t.Errorf("%d series, want %d with %s", series, maxEnvoyStats+1, want)
	}
}

// TestEnvoyStatsDBounded: past the StatsD sink's own bound on names
// (fewer than maxEnvoyStats descriptors' five counters), a descriptor's
// hits go to StatsD's overflow counters. Its counters were nil until then,
// whose Add does nothing: hits of every descriptor past the sink's bound
// reached StatsD under no name at all.
func TestEnvoyStatsDBounded(t *testing.T) {
	l, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	sink, err := statsd.New(statsd.Options{Addr: l.LocalAddr().String(), FlushInterval: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	defer sink.Close()
	m := newEnvoyMetrics(&metrics.Registry{}, sink)
	for i := range maxEnvoyStats {
		m.Add(1, totalHits, fmt.Sprintf("edge.remote_address_10.%d.%d.%d", i>>16, i>>8&255, i&255))
	}
	nils := 0
	m.names.Range(func(_, v any) bool {
		for _, c := range v.(*envoyStat).sd {
			if c == nil {
				nils++
			}
		}
		return true
	})
	if nils > 0 {
		t.Errorf("%d StatsD counters of kept descriptors are nil: their hits are lost", nils)
	}
}
