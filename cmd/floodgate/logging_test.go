package main

import (
	"bytes"
	"encoding/json"
	"os"
	"strings"
	"testing"
)

// TestLogFlags: --log-format and --log-level, from flags, from
// $FLOODGATE_LOG_* and from envoyproxy/ratelimit's $LOG_*, give the
// logger asked for; a bad value is a clear error and exit status 2.
func TestLogFlags(t *testing.T) {
	tests := []struct {
		name   string
		args   []string
		env    map[string]string
		code   int    // of parseServeFlags; 0: it goes on
		stderr string // in the error
		json   bool
		debug  bool // a debug line is written
		warn   bool // a warn line is written
	}{
		{name: "defaults", warn: true},
		{name: "json", args: []string{"--log-format", "json"}, json: true, warn: true},
		{name: "JSON in any case", args: []string{"--log-format", "JSON"}, json: true, warn: true},
		{name: "debug", args: []string{"--log-level", "debug"}, debug: true, warn: true},
		{name: "error", args: []string{"--log-level", "error"}},
		{name: "floodgate env", env: map[string]string{"FLOODGATE_LOG_FORMAT": "json", "FLOODGATE_LOG_LEVEL": "debug"}, json: true, debug: true, warn: true},
		{name: "upstream env", env: map[string]string{"LOG_FORMAT": "json", "LOG_LEVEL": "WARNING"}, json: true, warn: true},
		{name: "floodgate env first", env: map[string]string{"FLOODGATE_LOG_LEVEL": "debug", "LOG_LEVEL": "error"}, debug: true, warn: true},
		{name: "flag over env", args: []string{"--log-format", "text"}, env: map[string]string{"FLOODGATE_LOG_FORMAT": "json"}, warn: true},
		{name: "bad format", args: []string{"--log-format", "xml"}, code: 2, stderr: `floodgate serve: --log-format ($FLOODGATE_LOG_FORMAT, $LOG_FORMAT): "xml" is not text or json`},
		{name: "bad level", args: []string{"--log-level", "loud"}, code: 2, stderr: `floodgate serve: --log-level ($FLOODGATE_LOG_LEVEL, $LOG_LEVEL): "loud" is not debug, info, warn or error`},
		{name: "empty level", args: []string{"--log-level="}, code: 2, stderr: `"" is not debug, info, warn or error`},
		{name: "bad upstream level", env: map[string]string{"LOG_LEVEL": "trace"}, code: 2, stderr: `"trace" is not debug`},
		{name: "bad env format", env: map[string]string{"FLOODGATE_LOG_FORMAT": "logfmt"}, code: 2, stderr: `"logfmt" is not text or json`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			for _, k := range []string{"FLOODGATE_LOG_FORMAT", "FLOODGATE_LOG_LEVEL", "LOG_FORMAT", "LOG_LEVEL"} {
				t.Setenv(k, "") // restored after the test
				os.Unsetenv(k)
			}
			for k, v := range tt.env {
				t.Setenv(k, v)
			}
			var stderr bytes.Buffer
			f, code, ok := parseServeFlags(tt.args, &stderr)
			if tt.code != 0 {
				if ok || code != tt.code || !strings.Contains(stderr.String(), tt.stderr) {
					t.Fatalf("ok %v, code %d, stderr %q; want code %d and %q", ok, code, stderr.String(), tt.code, tt.stderr)
				}
				return
			}
			if !ok {
				t.Fatalf("code %d: %s", code, stderr.String())
			}
			var logs, stdout bytes.Buffer
			log, b, err := f.log.logger(&logs, &stdout)
			if err != nil {
				t.Fatal(err)
			}
			log = log.With("component", "test")
			log.Debug("a debug line")
			log.Warn("a warn line", "rule", "api")
			b.line("store: memory", "store", "memory")
			var lines []string
			if s := strings.TrimSuffix(logs.String(), "\n"); s != "" {
				lines = strings.Split(s, "\n")
			}
			if got := strings.Contains(logs.String(), "a debug line"); got != tt.debug {
				t.Errorf("debug line written: %v, want %v:\n%s", got, tt.debug, logs.String())
			}
			if got := strings.Contains(logs.String(), "a warn line"); got != tt.warn {
				t.Errorf("warn line written: %v, want %v:\n%s", got, tt.warn, logs.String())
			}
			if !tt.json {
				for _, l := range lines {
					if !strings.HasPrefix(l, "time=") || !strings.Contains(l, " component=test") {
						t.Errorf("not a text line with its component: %q", l)
					}
				}
				if stdout.String() != "store: memory\n" {
					t.Errorf("banner %q, want the plain line", stdout.String())
				}
				return
			}
			for _, l := range append(lines, strings.TrimSuffix(stdout.String(), "\n")) {
				var rec map[string]any
				if err := json.Unmarshal([]byte(l), &rec); err != nil {
					t.Fatalf("not JSON: %q: %v", l, err)
				}
				for _, k := range []string{"time", "level", "msg", "component"} {
					if _, ok := rec[k]; !ok {
						t.Errorf("no %q in %s", k, l)
					}
				}
			}
			if !strings.Contains(stdout.String(), `"msg":"store: memory","component":"serve","store":"memory"`) {
				t.Errorf("banner record %q", stdout.String())
			}
		})
	}
}
