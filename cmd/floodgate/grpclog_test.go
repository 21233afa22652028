package main

import (
	"bytes"
	"log/slog"
	"strings"
	"testing"
	"time"
)

// TestGRPCLogger: grpc-go's lines come out as component grpc, info at
// debug only, and warnings and errors a line a second each, the next
// counting those held back.
func TestGRPCLogger(t *testing.T) {
	now := time.Unix(1000, 0)
	tests := []struct {
		name    string
		level   slog.Level // of floodgate's log
		advance time.Duration
		emit    func(g *grpcLogger)
		want    []string // lines, without time
	}{
		{"info filtered", slog.LevelInfo, 0, func(g *grpcLogger) { g.Infof("picked %s", "addr") }, nil},
		{"info at debug", slog.LevelDebug, 0, func(g *grpcLogger) { g.Infof("picked %s", "addr") },
			[]string{`level=DEBUG msg="floodgate: grpc" component=grpc message="picked addr"`}},
		{"warnings limited", slog.LevelInfo, 0, func(g *grpcLogger) {
			for range 5 {
				g.Warningln("handshake failed")
			}
		}, []string{`level=WARN msg="floodgate: grpc" component=grpc message="handshake failed"`}},
		{"errors limited apart from warnings", slog.LevelInfo, 0, func(g *grpcLogger) {
			g.Warning("w")
			g.Error("e")
			g.Errorf("e%d", 2)
		}, []string{
			`level=WARN msg="floodgate: grpc" component=grpc message=w`,
			`level=ERROR msg="floodgate: grpc" component=grpc message=e`,
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var buf bytes.Buffer
			log := slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: tt.level,
				ReplaceAttr: func(_ []string, a slog.Attr) slog.Attr { return dropTime(a) }}))
			g := newGRPCLogger(slog.New(slog.DiscardHandler), func() time.Time { return now })
			g.use(log)
			tt.emit(g)
			got := strings.Split(strings.TrimSuffix(buf.String(), "\n"), "\n")
			if buf.Len() == 0 {
				got = nil
			}
			if strings.Join(got, "\n") != strings.Join(tt.want, "\n") {
				t.Errorf("lines:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(tt.want, "\n"))
			}
			if g.V(0) != (tt.level <= slog.LevelDebug) || g.V(2) {
				t.Errorf("V(0) %v, V(2) %v at level %v", g.V(0), g.V(2), tt.level)
			}
		})
	}
	// A second later, the next warning counts those held back.
	var buf bytes.Buffer
	g := newGRPCLogger(slog.New(slog.NewTextHandler(&buf, nil)), func() time.Time { return now })
	for range 4 {
		g.Warning("x")
	}
	now = now.Add(time.Second)
	g.Warning("x")
	if n := strings.Count(buf.String(), "\n"); n != 2 || !strings.Contains(buf.String(), "suppressed=3") {
		t.Errorf("want 2 lines, the second with suppressed=3:\n%s", buf.String())
	}
}

func dropTime(a slog.Attr) slog.Attr {
	if a.Key == slog.TimeKey {
		return slog.Attr{}
	}
	return a
}
