package main

import (
	"flag"
	"fmt"
	"io"
	"log/slog"
	"strings"

	"github.com/floodgate/floodgate/internal/lib/logctx"
)

// logFlags are --log-format and --log-level: how floodgate serve writes
// its log, to stderr.
type logFlags struct {
	format string // text or json
	level  string // debug, info, warn or error
}

// register adds the flags to fs, their defaults from $FLOODGATE_LOG_FORMAT
// and $FLOODGATE_LOG_LEVEL, else envoyproxy/ratelimit's $LOG_FORMAT and
// $LOG_LEVEL, so that its deployments keep their log settings.
func (l *logFlags) register(fs *flag.FlagSet, e *env) {
	fs.StringVar(&l.format, "log-format", e.str("FLOODGATE_LOG_FORMAT", e.str("LOG_FORMAT", "text")), "log format: text (key=value) or json, one object a line; with json the startup lines on stdout are JSON too ($FLOODGATE_LOG_FORMAT, or $LOG_FORMAT as envoyproxy/ratelimit names it)")
	fs.StringVar(&l.level, "log-level", e.str("FLOODGATE_LOG_LEVEL", e.str("LOG_LEVEL", "info")), "least severe log lines written: debug, info, warn or error ($FLOODGATE_LOG_LEVEL, or $LOG_LEVEL as envoyproxy/ratelimit names it)")
}

// parseLogLevel reads a level as written in --log-level, in any case;
// "warning" is warn, as envoyproxy/ratelimit's logrus spells it.
func parseLogLevel(s string) (slog.Level, error) {
	switch strings.ToLower(strings.TrimSpace(s)) {
	case "debug":
		return slog.LevelDebug, nil
	case "info":
		return slog.LevelInfo, nil
	case "warn", "warning":
		return slog.LevelWarn, nil
	case "error":
		return slog.LevelError, nil
	}
	return 0, fmt.Errorf("--log-level ($FLOODGATE_LOG_LEVEL, $LOG_LEVEL): %q is not debug, info, warn or error", s)
}

// json reports whether the format is JSON; a format neither text nor json
// is an error.
func (l *logFlags) json() (bool, error) {
	switch strings.ToLower(strings.TrimSpace(l.format)) {
	case "text":
		return false, nil
	case "json":
		return true, nil
	}
	return false, fmt.Errorf("--log-format ($FLOODGATE_LOG_FORMAT, $LOG_FORMAT): %q is not text or json", l.format)
}

// logger returns the logger the flags ask for, writing to w, and the
// banner for the startup lines on stdout.
func (l *logFlags) logger(w, stdout io.Writer) (*slog.Logger, banner, error) {
	js, err := l.json()
	if err != nil {
		return nil, banner{}, err
	}
	level, err := parseLogLevel(l.level)
	if err != nil {
		return nil, banner{}, err
	}
	o := &slog.HandlerOptions{Level: level}
	// A line logged with a request's context carries its trace id.
	if js {
		// The banner is what serve prints, whatever the level: as records,
		// so that stdout is JSON only, too.
		b := banner{json: slog.New(slog.NewJSONHandler(stdout, nil)).With("component", "serve")}
		return slog.New(logctx.NewHandler(slog.NewJSONHandler(w, o))), b, nil
	}
	return slog.New(logctx.NewHandler(slog.NewTextHandler(w, o))), banner{text: stdout}, nil
}

// banner prints the startup lines (the version, the store, the rules,
// where serve listens): as plain lines for text, which people and the
// docs read, or as JSON records with the line as msg, and attrs.
type banner struct {
	text io.Writer
	json *slog.Logger
}

// line prints msg, or with JSON a record of msg and attrs.
func (b banner) line(msg string, attrs ...any) {
	if b.json != nil {
		b.json.Info(msg, attrs...)
		return
	}
	fmt.Fprintln(b.text, msg)
}
