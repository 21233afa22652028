package service_test

import (
	"errors"
	"log/slog"
	"testing"

	"github.com/floodgate/floodgate"
	"github.com/floodgate/floodgate/internal/server/config"
	"github.com/floodgate/floodgate/internal/server/service"
)

// TestPrepare: what Options.Prepare makes of a configuration is kept with
// it, and a configuration it fails on is refused, at New and at Apply,
// keeping the rules and the prepared state in use together. This is how
// package envoy's domains follow the rules.
func TestPrepare(t *testing.T) {
	errPrepare := errors.New("cannot prepare")
	first, second, bad := config.Example(), config.Example(), config.Example()
	prepare := func(cfg *config.Config) (any, error) {
		switch cfg {
		case first:
			return "first", nil
		case second:
			return "second", nil
		}
		return nil, errPrepare
	}
	st := floodgate.NewMemoryStore(&floodgate.MemoryOptions{SweepInterval: -1})
	t.Cleanup(func() { st.Close() })
	if _, err := service.New(st, bad, &service.Options{Logger: slog.New(slog.DiscardHandler), Prepare: prepare}); !errors.Is(err, errPrepare) {
		t.Fatalf("New with a configuration Prepare fails on: %v, want %v", err, errPrepare)
	}
	svc, err := service.New(st, first, &service.Options{Logger: slog.New(slog.DiscardHandler), Prepare: prepare})
	if err != nil {
		t.Fatal(err)
	}
	for _, step := range []struct {
		name    string
		cfg     *config.Config
		wantErr error
		want    any
		wantCfg *config.Config
	}{
		{"at New", nil, nil, "first", first},
		{"applied", second, nil, "second", second},
		{"refused", bad, errPrepare, "second", second},
		{"back", first, nil, "first", first},
	} {
		if step.cfg != nil {
			if err := svc.Apply("rules.yaml", step.cfg, nil); !errors.Is(err, step.wantErr) {
				t.Errorf("%s: Apply: %v, want %v", step.name, err, step.wantErr)
			}
		}
		if got := svc.Prepared(); got != step.want || svc.Config() != step.wantCfg {
			t.Errorf("%s: Prepared() = %v, config %p; want %v, config %p", step.name, got, svc.Config(), step.want, step.wantCfg)
		}
	}
	plain, err := service.New(st, first, &service.Options{Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	if got := plain.Prepared(); got != nil {
		t.Errorf("without Prepare: Prepared() = %v, want nil", got)
	}
}
