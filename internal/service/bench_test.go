package service_test

import (
	"context"
	"fmt"
	"log/slog"
	"testing"

	rls "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/floodgate/floodgate"
	"github.com/floodgate/floodgate/internal/config"
	"github.com/floodgate/floodgate/internal/dash"
	"github.com/floodgate/floodgate/internal/service"
)

// BenchmarkCheck is one decision through the service, as the HTTP API and
// the Redis protocol make it, on the memory store: the rule's lookup, the
// key's encoding, the decision and the metrics.
func BenchmarkCheck(b *testing.B) {
	st := floodgate.NewMemoryStore(&floodgate.MemoryOptions{SweepInterval: -1})
	defer st.Close()
	svc, err := service.New(st, config.Example(), &service.Options{Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		svc.Check(ctx, "example", "user:42", 0)
	}
}

// BenchmarkCheckDenied is a denied decision, without and with a hook that
// counts denials as the dashboard's does.
func BenchmarkCheckDenied(b *testing.B) {
	for _, tt := range []struct {
		name string
		hook func(rule, key string)
	}{{"no-dashboard", nil}, {"dashboard", nil}} {
		b.Run(tt.name, func(b *testing.B) {
			st := floodgate.NewMemoryStore(&floodgate.MemoryOptions{SweepInterval: -1})
			defer st.Close()
			var board *dash.Dashboard
			if tt.name == "dashboard" {
				tt.hook = func(rule, key string) { board.Denied(rule, key) }
			}
			svc, err := service.New(st, config.Example(), &service.Options{Logger: slog.New(slog.DiscardHandler), OnDenied: tt.hook})
			if err != nil {
				b.Fatal(err)
			}
			if tt.hook != nil {
				board = dash.New(svc, nil)
				defer board.Close()
			}
			ctx := context.Background()
			svc.Check(ctx, "example", "user:42", 20) // empty: every later check is denied
			b.ReportAllocs()
			for b.Loop() {
				svc.Check(ctx, "example", "user:42", 1)
			}
		})
	}
}

// BenchmarkShouldRateLimit is one Envoy request through the service on the
// memory store: the descriptors' lookup, their decisions (side by side
// for three), the answer and the metrics.
func BenchmarkShouldRateLimit(b *testing.B) {
	st := floodgate.NewMemoryStore(&floodgate.MemoryOptions{SweepInterval: -1})
	defer st.Close()
	cfg, err := config.Parse("web.yaml", []byte(envoyDomain))
	if err != nil {
		b.Fatal(err)
	}
	svc, err := service.New(st, cfg, &service.Options{Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	for _, n := range []int{1, 3} {
		req := &rls.RateLimitRequest{Domain: "web"}
		for i := range n {
			req.Descriptors = append(req.Descriptors, rlsDesc("ip", string(rune('a'+i))))
		}
		b.Run(fmt.Sprintf("descriptors=%d", n), func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, err := svc.ShouldRateLimit(ctx, req); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
