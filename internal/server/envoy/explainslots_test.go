package envoy_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/floodgate/floodgate"
	"github.com/floodgate/floodgate/internal/testkit/envoytest"
	"github.com/floodgate/floodgate/storetest"
)

// The Envoy explanation of a concurrency descriptor: its slots held and
// when the earliest frees, OVER_LIMIT when every slot is held, and a
// stream-done call is never over; explaining acquires nothing.
func TestExplainEnvoyConcurrency(t *testing.T) {
	clock := storetest.NewClock(storetest.Base)
	st := floodgate.NewMemoryStore(&floodgate.MemoryOptions{Clock: clock, SweepInterval: -1})
	t.Cleanup(func() { st.Close() })
	svc := newEnvoyOn(t, st, "api.yaml", slotDomain, nil)
	ctx := context.Background()
	start := envoytest.Request("api", envoytest.Descriptor("api_key", "k1", "floodgate_permit", "req-1"))
	done := envoytest.Request("api", envoytest.Descriptor("api_key", "k1", "floodgate_permit", "req-1", "floodgate_release", "1"))
	for _, step := range []struct {
		name    string
		acquire string // a request id to acquire with first; "" for none
		advance time.Duration
		req     bool // the stream-done call
		held    int64
		freeIn  int64 // ms; 0: none held
		code    string
		why     string
	}{
		{name: "fresh", code: "OK", why: "0 of 2 slots are held now"},
		{name: "one held", acquire: "req-1", advance: 10 * time.Second, held: 1, freeIn: 50000, code: "OK",
			why: "1 of 2 slots are held now; the earliest permit expires in 50s"},
		{name: "full", acquire: "req-2", held: 2, freeIn: 50000, code: "OVER_LIMIT", why: "a request now would find every slot held"},
		{name: "stream done", req: true, held: 2, freeIn: 50000, code: "OK", why: "it carries the release marker"},
	} {
		if step.acquire != "" {
			r := envoytest.Request("api", envoytest.Descriptor("api_key", "k1", "floodgate_permit", step.acquire))
			if resp, err := svc.ShouldRateLimit(ctx, r); err != nil || resp.OverallCode.String() != "OK" {
				t.Fatal(resp, err)
			}
		}
		clock.Advance(step.advance)
		req := start
		if step.req {
			req = done
		}
		for round := range 2 { // the second sees what the first did: nothing
			e, err := svc.Explain(ctx, req)
			if err != nil {
				t.Fatal(err)
			}
			de := e.Descriptors[0]
			c := de.Concurrency
			if c == nil || c.Slots != 2 || c.LeaseMs != 60000 || c.Held != step.held || c.Release != step.req || de.Code != step.code || e.OverallCode != step.code ||
				(c.FreeInMs == nil) != (step.freeIn == 0) || (c.FreeInMs != nil && *c.FreeInMs != step.freeIn) {
				t.Fatalf("%s, round %d: %+v %+v", step.name, round, de, c)
			}
			if why := strings.Join(de.Why, "\n"); !strings.Contains(why, step.why) {
				t.Errorf("%s: why lacks %q:\n%s", step.name, step.why, why)
			}
			if !strings.Contains(e.Why[0], "1 of 1 descriptors have a limit in force") {
				t.Errorf("%s: %q", step.name, e.Why[0])
			}
		}
	}
}
