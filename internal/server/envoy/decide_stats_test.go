package envoy

import (
	"bytes"
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/floodgate/floodgate/internal/server/metrics"
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
