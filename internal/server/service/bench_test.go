package service_test

import (
	"context"
	"log/slog"
	"testing"

	"github.com/floodgate/floodgate"
	"github.com/floodgate/floodgate/internal/server/config"
	"github.com/floodgate/floodgate/internal/server/dash"
	"github.com/floodgate/floodgate/internal/server/service"
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
