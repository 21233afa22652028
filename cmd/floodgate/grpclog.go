package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"sync/atomic"
	"time"

	"github.com/floodgate/floodgate/internal/lib/lograte"
)

// grpcLogger takes grpc-go's log lines (a failed handshake, a broken
// connection: one a client, many a second under a flood) into floodgate's
// log as component grpc: its info lines as debug, its warnings and errors
// a line a second each at most, counting those held back. grpc-go has one
// logger for the process, set by main before any gRPC call.
type grpcLogger struct {
	log        atomic.Pointer[slog.Logger]
	warn, errs *lograte.Limiter
}

// newGRPCLogger returns a grpcLogger on log, timed by now (default
// time.Now).
func newGRPCLogger(log *slog.Logger, now func() time.Time) *grpcLogger {
	g := &grpcLogger{warn: lograte.New(time.Second, now), errs: lograte.New(time.Second, now)}
	g.use(log)
	return g
}

// use sends the lines from now on to log, as component grpc.
func (g *grpcLogger) use(log *slog.Logger) {
	g.log.Store(log.With("component", "grpc"))
}

func (g *grpcLogger) out(level slog.Level, text string) {
	log := g.log.Load()
	ctx := context.Background()
	text = strings.TrimSpace(text)
	switch {
	case level >= slog.LevelError:
		g.errs.Log(ctx, log, level, "floodgate: grpc", "message", text)
	case level >= slog.LevelWarn:
		g.warn.Log(ctx, log, level, "floodgate: grpc", "message", text)
	default:
		log.Log(ctx, level, "floodgate: grpc", "message", text)
	}
}

// enabled reports whether a line at level would be written, so that
// grpc-go's chatty info lines are not even formatted when filtered out.
func (g *grpcLogger) enabled(level slog.Level) bool {
	return g.log.Load().Enabled(context.Background(), level)
}

// Info, Infoln and Infof log at debug: grpc-go's info is connection
// chatter.
func (g *grpcLogger) Info(args ...any) {
	if g.enabled(slog.LevelDebug) {
		g.out(slog.LevelDebug, fmt.Sprint(args...))
	}
}

func (g *grpcLogger) Infoln(args ...any) {
	if g.enabled(slog.LevelDebug) {
		g.out(slog.LevelDebug, fmt.Sprintln(args...))
	}
}

func (g *grpcLogger) Infof(format string, args ...any) {
	if g.enabled(slog.LevelDebug) {
		g.out(slog.LevelDebug, fmt.Sprintf(format, args...))
	}
}

func (g *grpcLogger) Warning(args ...any)   { g.out(slog.LevelWarn, fmt.Sprint(args...)) }
func (g *grpcLogger) Warningln(args ...any) { g.out(slog.LevelWarn, fmt.Sprintln(args...)) }
func (g *grpcLogger) Warningf(format string, args ...any) {
	g.out(slog.LevelWarn, fmt.Sprintf(format, args...))
}
func (g *grpcLogger) Error(args ...any)   { g.out(slog.LevelError, fmt.Sprint(args...)) }
func (g *grpcLogger) Errorln(args ...any) { g.out(slog.LevelError, fmt.Sprintln(args...)) }
func (g *grpcLogger) Errorf(format string, args ...any) {
	g.out(slog.LevelError, fmt.Sprintf(format, args...))
}

// Fatal, Fatalln and Fatalf log, unlimited, and exit with status 1, as
// grpc-go's contract for them says.
func (g *grpcLogger) Fatal(args ...any) { g.fatal(fmt.Sprint(args...)) }
func (g *grpcLogger) Fatalln(args ...any) {
	g.fatal(fmt.Sprintln(args...))
}
func (g *grpcLogger) Fatalf(format string, args ...any) { g.fatal(fmt.Sprintf(format, args...)) }

func (g *grpcLogger) fatal(text string) {
	g.log.Load().Error("floodgate: grpc", "message", strings.TrimSpace(text), "fatal", true)
	os.Exit(1)
}

// V reports whether verbosity l is on: only 0, and only at debug, as no
// floodgate level is more verbose.
func (g *grpcLogger) V(l int) bool { return l <= 0 && g.enabled(slog.LevelDebug) }
