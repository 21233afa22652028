package service_test

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/floodgate/floodgate"
	"github.com/floodgate/floodgate/fallback"
	"github.com/floodgate/floodgate/internal/server/config"
	"github.com/floodgate/floodgate/internal/server/service"
	"github.com/floodgate/floodgate/internal/testkit/redistest"
	"github.com/floodgate/floodgate/redisstore"
	"github.com/floodgate/floodgate/storetest"
)

func ms(n int64) *int64 { return &n }

// newFallbackService returns a service of rules as serve runs it: on a
// fresh redis-server (returned, to stop) behind a fallback that shares
// each limit among 2 instances and takes over at the first failure.
func newFallbackService(t *testing.T, rules string, mode ...fallback.Mode) (*service.Service, *redistest.Server) {
	t.Helper()
	m := fallback.Local
	if len(mode) > 0 {
		m = mode[0]
	}
	srv := redistest.Start(t)
	clock := storetest.NewClock(storetest.Base)
	rs := redisstore.New(srv.Client(t), &redisstore.Options{Clock: clock})
	t.Cleanup(func() { rs.Close() })
	// A budget a loaded machine keeps: Redis up must answer every call.
	fb := fallback.New(rs, &fallback.Options{Clock: clock, Mode: m, Instances: 2, Threshold: 1, Budget: 5 * time.Second, Logger: slog.New(slog.DiscardHandler)})
	t.Cleanup(func() { fb.Close() })
	cfg, err := config.Parse("rules.yaml", []byte(rules))
	if err != nil {
		t.Fatal(err)
	}
	svc, err := service.New(fb, cfg, &service.Options{Fallback: fb, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	return svc, srv
}

// Explain on the memory store, case by case: the limit that decides, a
// shadow rule, an override with its TTL, a fresh key; and it charges
// nothing.
func TestExplain(t *testing.T) {
	ctx := context.Background()
	type lim struct {
		remaining, quota int64
		retry            *int64 // nil: a peek cannot tell
		from             string
	}
	tests := []struct {
		name     string
		rule     string
		checks   int64 // of cost 1 first
		override *config.Override
		limits   []lim
		decides  int
		allowed  bool
		shadow   bool
		ttlMs    int64 // -1: no override
		why      []string
	}{
		{name: "fresh", rule: "api", limits: []lim{{2, 2, ms(0), "rule"}}, allowed: true, ttlMs: -1,
			why: []string{`key "k" is checked against rule "api": 1 limit`, "a check of cost 1 would be allowed", "embedded memory store"}},
		{name: "bucket-spent", rule: "api", checks: 2, limits: []lim{{0, 2, nil, "rule"}}, ttlMs: -1,
			why: []string{`limit 0 of rule "api" (api: token-bucket 1/1h0m0s burst 2): 0 of 2 left, full again in 2h0m0s`, "would be denied by limit 0, which admits 1 again within 2h0m0s"}},
		{name: "two-limits", rule: "tiered", checks: 1, limits: []lim{{4, 5, ms(0), "rule"}, {0, 1, nil, "rule"}}, decides: 1, ttlMs: -1,
			why: []string{"2 limits, checked as one", `limit 0 of rule "tiered" (hourly: `, "would be denied by limit 1"}},
		{name: "shadow", rule: "quiet", checks: 1, limits: []lim{{0, 1, ms(3600000), "rule"}}, shadow: true, ttlMs: -1,
			why: []string{"shadow mode", "would be denied by limit 0, but the rule is in shadow mode: it is let through"}},
		{name: "override", rule: "api", checks: 2, ttlMs: 3600000,
			override: &config.Override{Limits: []floodgate.Limit{floodgate.FixedWindow(10, time.Hour).Named("vip")}, TTL: time.Hour, Strategy: floodgate.Additive},
			limits:   []lim{{8, 10, ms(0), "override"}}, allowed: true,
			why: []string{`key "k" has an override, for 1h0m0s more: its 1 limit is in force in place of rule "api"'s`, `limit 0 of the override (vip: `}},
		{name: "override-forever", rule: "api", ttlMs: 0,
			override: &config.Override{Limits: []floodgate.Limit{floodgate.FixedWindow(1, time.Hour)}},
			limits:   []lim{{1, 1, ms(0), "override"}}, allowed: true, why: []string{"override, for ever"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			svc := newService(t)
			for range tt.checks {
				if _, err := svc.Check(ctx, tt.rule, "k", 1); err != nil {
					t.Fatal(err)
				}
			}
			if tt.override != nil {
				if err := svc.SetOverride(ctx, tt.rule, "k", *tt.override); err != nil {
					t.Fatal(err)
				}
			}
			for round := range 2 { // the second sees what the first did: nothing
				e, err := svc.Explain(ctx, tt.rule, "k")
				if err != nil {
					t.Fatal(err)
				}
				if e.Rule != tt.rule || e.Key != "k" || e.Shadow != tt.shadow || e.Allowed != tt.allowed || e.Decides != tt.decides || len(e.Limits) != len(tt.limits) {
					t.Fatalf("round %d: %+v", round, e)
				}
				switch {
				case tt.ttlMs < 0 && e.Override != nil, tt.ttlMs >= 0 && (e.Override == nil || e.Override.TTLMs != tt.ttlMs):
					t.Errorf("round %d: override %+v; want TTL %d ms (-1: none)", round, e.Override, tt.ttlMs)
				}
				for i, w := range tt.limits {
					l := e.Limits[i]
					if l.Remaining != w.remaining || l.Quota != w.quota || l.From != w.from || l.Decides != (i == tt.decides) ||
						(l.RetryAfterMs == nil) != (w.retry == nil) || (w.retry != nil && *l.RetryAfterMs != *w.retry) {
						t.Errorf("round %d: limit %d: %+v; want %+v", round, i, l, w)
					}
				}
				if e.Store.Name != "memory" || e.Store.Source != "store" || e.Store.Fallback != nil {
					t.Errorf("round %d: store %+v; want the memory store", round, e.Store)
				}
				why := strings.Join(e.Why, "\n")
				for _, want := range tt.why {
					if !strings.Contains(why, want) {
						t.Errorf("round %d: why lacks %q:\n%s", round, want, why)
					}
				}
			}
		})
	}
}

func TestExplainBadInput(t *testing.T) {
	svc := newService(t)
	tests := []struct {
		rule, key string
		want      error
		msg       string
	}{
		{"", "k", service.ErrBadRequest, "rule is required"},
		{"nope", "k", service.ErrUnknownRule, `unknown rule "nope"`},
		{"api", "", service.ErrBadRequest, "empty key"},
		{"api", strings.Repeat("k", service.MaxKeyLen+1), service.ErrBadRequest, "more than the maximum 512"},
	}
	for _, tt := range tests {
		_, err := svc.Explain(context.Background(), tt.rule, tt.key)
		if !errors.Is(err, tt.want) || !strings.Contains(err.Error(), tt.msg) {
			t.Errorf("Explain(%q, %d bytes of key) = %v; want %v saying %q", tt.rule, len(tt.key), err, tt.want, tt.msg)
		}
	}
}

// On Redis behind the fallback, as serve runs it: Redis answers, with
// the local share beside it; when Redis is down, the fallback answers,
// and Explain says so.
func TestExplainRedisAndFallback(t *testing.T) {
	ctx := context.Background()
	svc, srv := newFallbackService(t, rules)
	if _, err := svc.Check(ctx, "tiered", "k", 1); err != nil {
		t.Fatal(err)
	}
	e, err := svc.Explain(ctx, "tiered", "k")
	if err != nil {
		t.Fatal(err)
	}
	st := e.Store
	if st.Name != "redis" || st.Source != "store" || st.Fallback == nil || st.Fallback.Degraded || st.Fallback.Mode != "local" || st.Fallback.Share != "1/2" || len(st.Fallback.Local) != 2 {
		t.Fatalf("Redis up: store %+v (fallback %+v)", st, st.Fallback)
	}
	if l := e.Limits; l[0].Remaining != 4 || l[1].Remaining != 0 || e.Decides != 1 {
		t.Errorf("Redis up: limits %+v, decides %d; want 4 and 0 left, limit 1 deciding", l, e.Decides)
	}
	if why := strings.Join(e.Why, "\n"); !strings.Contains(why, "Redis answers") || !strings.Contains(why, "if Redis fails, the fallback answers: a local limiter with 1/2 of each limit") {
		t.Errorf("Redis up: why:\n%s", why)
	}

	srv.Stop()
	e, err = svc.Explain(ctx, "tiered", "k")
	if err != nil {
		t.Fatal(err)
	}
	st = e.Store
	if st.Source != "local" || st.Fallback == nil || !st.Fallback.Degraded {
		t.Fatalf("Redis down: store %+v (fallback %+v); want the local limiter", st, st.Fallback)
	}
	if l := e.Limits; l[0].Quota != 2 || l[1].Quota != 1 { // 5/2 rounds down; a share is at least 1
		t.Errorf("Redis down: limits %+v; want the local shares' quotas", l)
	}
	if why := strings.Join(e.Why, "\n"); !strings.Contains(why, "Redis is failing for this key: the fallback answers, a local limiter with 1/2 of each limit") {
		t.Errorf("Redis down: why:\n%s", why)
	}
	if !svc.Ready() {
		t.Errorf("an explanation opened the breaker: not ready")
	}
}
