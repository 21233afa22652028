package main

import (
	"bytes"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/floodgate/floodgate/internal/server/config"
)

// TestScanDirectory: a rules directory's snapshot changes when a file
// comes, changes or goes, in it or in a directory below it (which Load
// reads), and not for a file that Load skips.
func TestScanDirectory(t *testing.T) {
	dir := t.TempDir()
	sub := filepath.Join(dir, "team", "edge")
	if err := os.MkdirAll(sub, 0o755); err != nil {
		t.Fatal(err)
	}
	writeFile(t, filepath.Join(dir, "a.yaml"), "domain: a\n")
	last, err := scan(dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, step := range []struct {
		name    string
		do      func()
		changed bool
	}{
		{"a file below comes", func() { writeFile(t, filepath.Join(sub, "e.yaml"), "domain: e\n") }, true},
		{"it changes, same size", func() { writeFile(t, filepath.Join(sub, "e.yaml"), "domain: f\n") }, true},
		{"a skipped file below comes", func() { writeFile(t, filepath.Join(sub, "notes.txt"), "x") }, false},
		{"nothing", func() {}, false},
		{"the file below goes", func() { os.Remove(filepath.Join(sub, "e.yaml")) }, true},
	} {
		step.do()
		now, err := scan(dir, last)
		if err != nil {
			t.Fatal(err)
		}
		if got := !now.same(last); got != step.changed {
			t.Errorf("%s: snapshot changed %v, want %v", step.name, got, step.changed)
		}
		last = now
	}
}

const watchFull = `rules:
  - name: api
    algorithm: token-bucket
    rate: 1000
    period: 1s
    burst: 1000
  - name: login
    algorithm: sliding-log
    limit: 5
    window: 1m
`

// TestWatcher drives the watcher on an injected clock: a file is reloaded
// once it has stayed the same for the settle time; one cut short (a number
// cut mid-write, a rule missing) is not, unless it stays so; one that
// drops a rule is reloaded at once only when it was renamed into place or
// on SIGHUP, else after removeSettle.
func TestWatcher(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "rules.yaml")
	writeFile(t, path, watchFull)
	first, err := config.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	files, err := scan(path, nil)
	if err != nil {
		t.Fatal(err)
	}
	var logs bytes.Buffer
	cur := first
	var applied []string // each reload: its rules and api's rate, or its error
	w := &watcher{path: path, settle: time.Second, removeSettle: 30 * time.Second, log: slog.New(slog.NewTextHandler(&logs, nil)),
		load: func() (*config.Config, error) { return config.Load(path) },
		apply: func(cfg *config.Config, err error) {
			if err != nil {
				applied = append(applied, "error")
				return
			}
			cur = cfg
			s := ""
			for _, r := range cfg.Rules {
				s += r.Name + " "
			}
			if r, ok := cfg.Rule("api"); ok {
				s += r.Limits[0].String()
			}
			applied = append(applied, strings.TrimSpace(s))
		},
		current: func() *config.Config { return cur }, applied: files}
	cutNumber := strings.Replace(watchFull, "rate: 1000", "rate: 1", 1)
	cutRule := watchFull[:strings.Index(watchFull, "  - name: login")]
	renamed := func(content string) func() {
		return func() {
			tmp := filepath.Join(dir, ".rules.yaml.tmp")
			writeFile(t, tmp, content)
			if err := os.Rename(tmp, path); err != nil {
				t.Fatal(err)
			}
		}
	}
	inPlace := func(content string) func() { return func() { writeFile(t, path, content) } }
	start := time.Date(2026, 11, 28, 12, 0, 0, 0, time.UTC)
	for _, step := range []struct {
		name string
		at   time.Duration // since start
		do   func()        // before the poll; nil: none
		hup  bool          // SIGHUP instead of a poll
		want string        // the reload done by this poll; "" none
	}{
		{"unchanged", 1 * time.Second, nil, false, ""},
		{"a number cut mid-write", 2 * time.Second, inPlace(cutNumber), false, ""},
		{"the write completes", 2500 * time.Millisecond, inPlace(watchFull), false, ""},
		{"settled: the whole file", 4 * time.Second, nil, false, "api login api: token-bucket 1000/1s burst 1000"},
		{"a rule cut off", 5 * time.Second, inPlace(cutRule), false, ""},
		{"cut, settled: held back", 6 * time.Second, nil, false, ""},
		{"still held", 20 * time.Second, nil, false, ""},
		{"the write completes, changed", 21 * time.Second, inPlace(strings.Replace(watchFull, "limit: 5", "limit: 6", 1)), false, ""},
		{"settled", 22 * time.Second, nil, false, "api login api: token-bucket 1000/1s burst 1000"},
		{"a number cut, stalled", 23 * time.Second, inPlace(cutNumber), false, ""},
		{"settled: applied, as it stays", 24 * time.Second, nil, false, "api login api: token-bucket 1/1s burst 1000"},
		{"a drop published by rename", 25 * time.Second, renamed(cutRule), false, ""},
		{"settled: applied at once", 26 * time.Second, nil, false, "api api: token-bucket 1000/1s burst 1000"},
		{"a rule comes back in place", 27 * time.Second, inPlace(watchFull), false, ""},
		{"settled", 28 * time.Second, nil, false, "api login api: token-bucket 1000/1s burst 1000"},
		{"a drop in place", 29 * time.Second, inPlace(cutRule), false, ""},
		{"held", 30 * time.Second, nil, false, ""},
		{"held still", 58 * time.Second, nil, false, ""},
		{"unchanged for removeSettle: deliberate", 59 * time.Second, nil, false, "api api: token-bucket 1000/1s burst 1000"},
		{"an invalid file", 60 * time.Second, inPlace("rules:\n  - name: api\n    rate: [\n"), false, ""},
		{"settled: reported once", 61 * time.Second, nil, false, "error"},
		{"not again", 62 * time.Second, nil, false, ""},
		{"back in place", 63 * time.Second, inPlace(watchFull), false, ""},
		{"a drop in place, then SIGHUP", 64 * time.Second, inPlace(cutRule), true, "api api: token-bucket 1000/1s burst 1000"},
		{"after SIGHUP, nothing to do", 66 * time.Second, nil, false, ""},
	} {
		if step.do != nil {
			step.do()
		}
		n := len(applied)
		if step.hup {
			w.reload()
		} else {
			w.poll(start.Add(step.at))
		}
		got := ""
		if len(applied) > n {
			got = strings.Join(applied[n:], "; ")
		}
		if got != step.want {
			t.Fatalf("%s: reloaded %q, want %q", step.name, got, step.want)
		}
	}
	if n := strings.Count(logs.String(), "drops rules in use"); n != 2 {
		t.Errorf("%d warnings of a drop held back, want 2:\n%s", n, logs.String())
	}
	if !strings.Contains(logs.String(), `dropped="[rule login]"`) {
		t.Errorf("the warning does not name the dropped rule:\n%s", logs.String())
	}
}
