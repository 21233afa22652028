package dash

import (
	"context"
	"fmt"
	"log/slog"
	"testing"
	"time"

	"github.com/floodgate/floodgate"
	"github.com/floodgate/floodgate/fallback"
	"github.com/floodgate/floodgate/internal/server/config"
	"github.com/floodgate/floodgate/internal/server/service"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// The sampler turns the service's counters into rates per rule; the
// snapshot has them, the denied keys, the switches and the latency.
func TestSnapshot(t *testing.T) {
	st := floodgate.NewMemoryStore(&floodgate.MemoryOptions{SweepInterval: -1})
	defer st.Close()
	var d *Dashboard
	svc, err := service.New(st, config.Example(), &service.Options{Logger: slog.New(slog.DiscardHandler),
		OnDenied: func(rule, key string) { d.Denied(rule, key) }})
	if err != nil {
		t.Fatal(err)
	}
	// A step of an hour: the ticker never fires; the test samples.
	d = New(svc, &Options{Store: "test store", Step: time.Hour, Window: 4 * time.Hour})
	defer d.Close()
	ctx := context.Background()
	for range 30 {
		svc.Check(ctx, "example", "abuser", 1) // 20 allowed, 10 denied
	}
	d.sample(time.Now(), false)
	d.Switched(fallback.Degraded)
	s := d.Snapshot()
	ex := s.Series["example"]
	if len(s.Times) != 1 || len(ex.Allowed) != 1 || ex.Allowed[0] != 20.0/3600 || ex.Denied[0] != 10.0/3600 {
		t.Fatalf("series %+v at %v, want one sample of 20 and 10 per hour", ex, s.Times)
	}
	if _, ok := s.Series["CL.THROTTLE"]; ok {
		t.Error("a CL.THROTTLE line without CL.THROTTLE traffic")
	}
	if top := s.Top["example"]; len(top) != 1 || top[0].Key != "abuser" || top[0].Count != 10 {
		t.Errorf("top keys %+v", s.Top)
	}
	if s.Store.Name != "test store" || len(s.Store.Events) != 1 || s.Store.Events[0].State != "degraded" || len(s.Store.P50) != 1 || s.Store.P50[0] <= 0 {
		t.Errorf("store %+v", s.Store)
	}
	if len(s.Rules) != 1 || s.Rules[0].Name != "example" {
		t.Errorf("rules %+v", s.Rules)
	}
	// The rings wrap: four samples in a window of four hold the last four.
	for range 6 {
		d.sample(time.Now(), false)
	}
	if s := d.Snapshot(); len(s.Times) != 4 || s.Series["example"].Allowed[3] != 0 {
		t.Errorf("after wrapping: %d samples, %+v", len(s.Times), s.Series["example"])
	}
	d.Close()
}

func TestQuantile(t *testing.T) {
	bounds := []float64{0.001, 0.01, 0.1}
	for _, tt := range []struct {
		counts []uint64
		q      float64
		want   float32
	}{
		{[]uint64{10, 0, 0, 0}, 0.5, 1},
		{[]uint64{50, 49, 1, 0}, 0.99, 10},
		{[]uint64{50, 49, 0, 1}, 0.999, 100}, // +Inf: the last bound
		{[]uint64{0, 1, 0, 0}, 0.5, 10},
	} {
		var total uint64
		for _, c := range tt.counts {
			total += c
		}
		if got := quantile(bounds, tt.counts, total, tt.q); got != tt.want {
			t.Errorf("quantile(%v, %v) = %v, want %v", tt.counts, tt.q, got, tt.want)
		}
	}
}

// The snapshot carries the Redis servers' status only when Options.Redis
// gives it.
func TestSnapshotRedis(t *testing.T) {
	st := floodgate.NewMemoryStore(&floodgate.MemoryOptions{SweepInterval: -1})
	defer st.Close()
	svc, err := service.New(st, config.Example(), &service.Options{Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		redis func() Redis
		want  string
	}{
		{nil, "<nil>"},
		{func() Redis {
			return Redis{Policies: []string{"allkeys-lru"}, Evicts: true, EvictedKeys: 3, Restarts: 1}
		}, "&{[allkeys-lru] true 3 1}"},
	} {
		d := New(svc, &Options{Step: time.Hour, Redis: tc.redis})
		if got := fmt.Sprint(d.Snapshot().Store.Redis); got != tc.want {
			t.Errorf("redis %s, want %s", got, tc.want)
		}
		d.Close()
	}
}

// The concurrency rules: their keys that acquired most through this
// instance, each with its slots held now as the store tells, within the
// bounds of looks per page; their denials are in the top keys.
func TestSnapshotConcurrency(t *testing.T) {
	st := floodgate.NewMemoryStore(&floodgate.MemoryOptions{SweepInterval: -1})
	defer st.Close()
	cfg, err := config.Parse("r.yaml", []byte("rules: [{name: api, algorithm: fixed-window, limit: 100, window: 1h}]\n"+
		"concurrency: [{name: llm, slots: 2, lease: 30s}, {name: export, slots: 1, lease: 1m, rules: [api]}]\n"))
	if err != nil {
		t.Fatal(err)
	}
	var d *Dashboard
	svc, err := service.New(st, cfg, &service.Options{Logger: slog.New(slog.DiscardHandler),
		OnDenied: func(rule, key string) { d.Denied(rule, key) }, OnAcquired: func(rule, key string) { d.Acquired(rule, key) }})
	if err != nil {
		t.Fatal(err)
	}
	d = New(svc, &Options{Step: time.Hour, TopCounters: 64})
	defer d.Close()
	ctx := context.Background()
	if s := d.Snapshot(); len(s.Concurrency) != 2 || s.Concurrency[0].Name != "export" || len(s.Concurrency[0].Holders) != 0 ||
		s.Concurrency[0].Rates[0] != "api" || s.Concurrency[1].Slots != 2 || s.Concurrency[1].LeaseMs != 30000 {
		t.Fatalf("before any acquire: %+v", s.Concurrency)
	}
	// busy acquires 3 times and releases once: 2 held, 1 denied; quiet
	// acquires and releases: none held.
	var first string
	for i := range 3 {
		a, err := svc.Acquire(ctx, "llm", "busy")
		if err != nil || a.Result.Allowed != (i < 2) {
			t.Fatal(a, err)
		}
		if i == 0 {
			first = a.Result.Permit.ID
		}
	}
	if _, err := svc.Release(ctx, "llm", "busy", first); err != nil {
		t.Fatal(err)
	}
	if _, err := svc.Acquire(ctx, "llm", "busy"); err != nil {
		t.Fatal(err)
	}
	a, err := svc.Acquire(ctx, "llm", "quiet")
	if err != nil {
		t.Fatal(err)
	}
	svc.Release(ctx, "llm", "quiet", a.Result.Permit.ID)
	// More keys than a rule shows: the page shows the first few.
	for i := range maxHolderLooks + 5 {
		svc.Acquire(ctx, "export", fmt.Sprintf("e%02d", i))
	}
	s := d.Snapshot()
	llm := s.Concurrency[1]
	if len(llm.Holders) != 2 || llm.Holders[0].Key != "busy" || llm.Holders[0].Acquires != 3 || llm.Holders[0].Held != 2 || llm.Holders[0].FreeInMs == nil ||
		llm.Holders[1].Key != "quiet" || llm.Holders[1].Held != 0 || llm.Holders[1].FreeInMs != nil {
		t.Fatalf("llm holders %+v", llm.Holders)
	}
	if top := s.Top["llm"]; len(top) != 1 || top[0].Key != "busy" || top[0].Count != 1 {
		t.Errorf("llm's denials: %+v", s.Top)
	}
	if ex := s.Concurrency[0]; len(ex.Holders) != holdersPerRule || ex.Holders[0].Held != 1 {
		t.Errorf("export holders %+v", ex.Holders)
	}
}
