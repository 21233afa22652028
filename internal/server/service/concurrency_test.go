package service_test

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/floodgate/floodgate"
	"github.com/floodgate/floodgate/internal/server/service"
	"github.com/floodgate/floodgate/storetest"
)

const slotRules = `rules:
  - {name: api, algorithm: fixed-window, limit: 2, window: 1h}
concurrency:
  - {name: llm, slots: 2, lease: 30s}
  - {name: export, slots: 5, lease: 1m, rules: [api]}
`

func TestServiceConcurrency(t *testing.T) {
	st := floodgate.NewMemoryStore(&floodgate.MemoryOptions{Clock: storetest.NewClock(storetest.Base), SweepInterval: -1})
	t.Cleanup(func() { st.Close() })
	svc := newServiceOn(t, st, slotRules)
	ctx := context.Background()
	a, err := svc.Acquire(ctx, "llm", "user:1")
	if err != nil || !a.Result.Allowed || a.Result.Held != 1 {
		t.Fatal(a, err)
	}
	if b, err := svc.Acquire(ctx, "llm", "user:1"); err != nil || !b.Result.Allowed {
		t.Fatal(b, err)
	}
	if c, err := svc.Acquire(ctx, "llm", "user:1"); err != nil || c.Result.Allowed || c.Result.Held != 2 || c.Result.RetryAfter <= 0 {
		t.Fatal(c, err)
	}
	id := a.Result.Permit.ID
	if r, err := svc.Extend(ctx, "llm", "user:1", id); err != nil || !r.Result.Allowed {
		t.Fatal(r, err)
	}
	if r, err := svc.Release(ctx, "llm", "user:1", id); err != nil || !r.Result.Allowed || r.Result.Held != 1 {
		t.Fatal(r, err)
	}
	if r, err := svc.Release(ctx, "llm", "user:1", id); err != nil || r.Result.Allowed {
		t.Fatal(r, err)
	}
	// A permit of another key, or of another rule, is a bad request.
	for _, tc := range []struct{ rule, key string }{{"llm", "user:2"}, {"export", "user:1"}} {
		if _, err := svc.Release(ctx, tc.rule, tc.key, id); !errors.Is(err, floodgate.ErrInvalidPermit) {
			t.Errorf("%s %s: %v", tc.rule, tc.key, err)
		}
	}
	if _, err := svc.Acquire(ctx, "api", "k"); !errors.Is(err, service.ErrUnknownRule) {
		t.Errorf("a rate rule is not a concurrency rule: %v", err)
	}
	// export decides api with it: 2 pass, the third is denied by api
	// and holds no slot.
	for i := range 3 {
		d, err := svc.Acquire(ctx, "export", "k")
		if err != nil || d.Result.Allowed != (i < 2) || len(d.Rates) != 1 || d.Rates[0].Result.Allowed != (i < 2) {
			t.Fatalf("export %d: %+v %v", i, d, err)
		}
		if i == 2 && d.Result.Held != 2 {
			t.Fatalf("the denied acquire kept its slot: %+v", d.Result)
		}
	}
	var b bytes.Buffer
	svc.Metrics.Write(&b)
	for _, want := range []string{
		`floodgate_slot_operations_total{rule="llm",op="acquire",outcome="granted"} 2`,
		`floodgate_slot_operations_total{rule="llm",op="acquire",outcome="denied"} 1`,
		`floodgate_slot_operations_total{rule="llm",op="release",outcome="not_held"} 1`,
		`floodgate_slot_operations_total{rule="export",op="acquire",outcome="denied"} 1`,
	} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("metrics lack %s", want)
		}
	}
}
