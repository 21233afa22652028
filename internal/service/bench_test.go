package service_test

import (
	"context"
	"log/slog"
	"testing"

	"github.com/floodgate/floodgate"
	"github.com/floodgate/floodgate/internal/config"
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
