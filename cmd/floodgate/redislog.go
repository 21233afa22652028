package main

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/floodgate/floodgate/internal/lib/lograte"
)

// redisLogger takes go-redis's log lines (a failed dial, several a second
// while Redis is down) into floodgate's log: at most one line a second,
// which counts the lines held back since the last.
type redisLogger struct {
	log   *slog.Logger
	limit *lograte.Limiter
}

func newRedisLogger(log *slog.Logger) *redisLogger {
	return &redisLogger{log: log, limit: lograte.New(time.Second, nil)}
}

// Printf implements go-redis's internal.Logging.
func (l *redisLogger) Printf(_ context.Context, format string, v ...any) {
	held, ok := l.limit.Allow()
	if !ok {
		return
	}
	attrs := []any{"message", strings.TrimPrefix(fmt.Sprintf(format, v...), "redis: ")}
	if held > 0 {
		attrs = append(attrs, "suppressed", held)
	}
	l.log.Warn("floodgate: redis client", attrs...)
}
