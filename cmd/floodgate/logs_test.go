package main

import (
	"encoding/json"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/floodgate/floodgate/internal/testkit/redistest"
)

// TestRedisOutageJSONLog: with --log-format json, ten seconds of a Redis
// that stops answering (SIGSTOP), under steady checks, log a bounded
// number of lines, each a JSON object with time, level, msg and
// component; and stdout holds JSON records only.
func TestRedisOutageJSONLog(t *testing.T) {
	const (
		outage   = 10 * time.Second
		maxLines = 30
	)
	for _, tt := range []struct {
		name          string
		down, up      func(t *testing.T, srv *redistest.Server)
		wantComponent string // among the lines, besides fallback and serve
	}{
		// A hung Redis: every call times out at --budget.
		{name: "SIGSTOP",
			down: func(t *testing.T, srv *redistest.Server) { srv.Signal(syscall.SIGSTOP) },
			up:   func(t *testing.T, srv *redistest.Server) { srv.Signal(syscall.SIGCONT) }},
		// A Redis gone: every dial is refused, which go-redis logs.
		{name: "stopped",
			down:          func(t *testing.T, srv *redistest.Server) { srv.Stop() },
			up:            func(t *testing.T, srv *redistest.Server) { srv.Restart(t) },
			wantComponent: "redis-client"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			srv := redistest.Start(t)
			in := serve(t, "--redis", "redis://"+srv.Addr+"/0", "--budget", "20ms", "--log-format", "json")
			if code, body := in.post(t, "/v1/check", `{"rule":"example","key":"k"}`); code != 200 {
				t.Fatalf("before the outage: %d %v", code, body)
			}
			tt.down(t, srv)
			resumed := false
			resume := func() {
				if !resumed {
					resumed = true
					tt.up(t, srv)
				}
			}
			t.Cleanup(resume)
			start := time.Now()
			checks := 0
			for ; checks < 500 && time.Since(start) < outage; checks++ { // about 20 a second
				in.post(t, "/v1/check", `{"rule":"example","key":"k"}`)
				time.Sleep(50 * time.Millisecond)
			}
			resume()
			waitFor(t, "the fallback to see Redis again", func() bool {
				return strings.Contains(in.stderr.String(), "primary store recovered")
			})
			if err := in.stop(t, syscall.SIGTERM); err != nil {
				t.Fatalf("exit: %v\n%s", err, in.stderr)
			}
			log := strings.TrimSuffix(in.stderr.String(), "\n")
			lines := strings.Split(log, "\n")
			t.Logf("%d checks in %.1fs of outage: %d log lines", checks, time.Since(start).Seconds(), len(lines))
			if len(lines) > maxLines {
				t.Errorf("%d log lines, want at most %d:\n%s", len(lines), maxLines, log)
			}
			components := map[string]bool{}
			for _, out := range []string{log, strings.TrimSuffix(in.stdout.String(), "\n")} {
				for _, l := range strings.Split(out, "\n") {
					var rec map[string]any
					if err := json.Unmarshal([]byte(l), &rec); err != nil {
						t.Errorf("not a JSON object: %q", l)
						continue
					}
					for _, k := range []string{"time", "level", "msg", "component"} {
						if s, ok := rec[k].(string); !ok || s == "" {
							t.Errorf("no %s in %s", k, l)
						}
					}
					if c, ok := rec["component"].(string); ok {
						components[c] = true
					}
				}
			}
			for _, c := range []string{"fallback", "serve", tt.wantComponent} {
				if c != "" && !components[c] {
					t.Errorf("no line of component %s:\n%s", c, log)
				}
			}
		})
	}
}
