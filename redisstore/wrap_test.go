package redisstore

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/floodgate/floodgate"
)

// TestWrap checks how wrap turns Redis's answers into floodgate's errors,
// nil (a success) included: it once called nil's Error method, and a
// rebase onto a calendar window crashed floodgate serve.
func TestWrap(t *testing.T) {
	canceled, cancel := context.WithCancel(context.Background())
	cancel()
	tests := []struct {
		name  string
		ctx   context.Context
		err   error
		is    error // nil: wrap returns nil
		inMsg string
	}{
		{"nil", context.Background(), nil, nil, ""},
		{"nil, context done", canceled, nil, nil, ""},
		{"store error", context.Background(), errors.New("LOADING"), floodgate.ErrStore, "redis: LOADING"},
		{"script's error", context.Background(), errors.New("FLOODGATE wrong type"), floodgate.ErrStore, "redis: wrong type"},
		{"caller's cancel", canceled, context.Canceled, context.Canceled, "context canceled"},
	}
	s := &Store{}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := s.wrap(tt.ctx, tt.err)
			switch {
			case tt.is == nil && got != nil:
				t.Fatalf("wrap(%v) = %v, want nil", tt.err, got)
			case tt.is != nil && (!errors.Is(got, tt.is) || !strings.Contains(got.Error(), tt.inMsg)):
				t.Fatalf("wrap(%v) = %v, want one wrapping %v that says %q", tt.err, got, tt.is, tt.inMsg)
			}
		})
	}
}
