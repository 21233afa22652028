package main

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync/atomic"
	"time"

	"github.com/floodgate/floodgate/internal/lib/lograte"
)

// redisLogger takes go-redis's log lines (a failed dial, several a second
// while Redis is down) into floodgate's log: at most one line a second,
// which counts the lines held back since the last.
type redisLogger struct {
	log   atomic.Pointer[slog.Logger]
	limit *lograte.Limiter
}

func newRedisLogger(log *slog.Logger) *redisLogger {
	l := &redisLogger{limit: lograte.New(time.Second, nil)}
	l.use(log)
	return l
}

// use sends the lines from now on to log, as component redis-client.
func (l *redisLogger) use(log *slog.Logger) {
	l.log.Store(log.With("component", "redis-client"))
}

// Printf implements go-redis's internal.Logging.
func (l *redisLogger) Printf(_ context.Context, format string, v ...any) {
	l.limit.Log(context.Background(), l.log.Load(), slog.LevelWarn, "floodgate: redis client",
		"message", strings.TrimPrefix(fmt.Sprintf(format, v...), "redis: "))
}
