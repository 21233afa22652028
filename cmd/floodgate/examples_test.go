package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"testing"

	"github.com/floodgate/floodgate/internal/server/config"
	"github.com/floodgate/floodgate/internal/testkit/redistest"
	"github.com/redis/go-redis/v9"
)

// notConfig are the YAML files under examples/ that are not floodgate's
// configuration, and why; every other one must load.
var notConfig = map[string]string{
	"envoy/envoy.yaml": "Envoy's own bootstrap, which asks floodgate",
}

// exampleConfigs returns what floodgate serve --config is given in the
// examples: every YAML file under examples/, and every directory that
// holds envoyproxy/ratelimit files (examples/envoy/README.md serves
// examples/envoy/config), relative to examples/.
func exampleConfigs(t *testing.T) []string {
	t.Helper()
	var files []string
	dirs := map[string]bool{}
	err := filepath.WalkDir(examplesDir, func(path string, e fs.DirEntry, err error) error {
		if err != nil || e.IsDir() {
			return err
		}
		rel, _ := filepath.Rel(examplesDir, path)
		if ext := filepath.Ext(path); ext != ".yaml" && ext != ".yml" {
			return nil
		}
		if why, ok := notConfig[filepath.ToSlash(rel)]; ok {
			t.Logf("%s: not floodgate's configuration: %s", rel, why)
			return nil
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		cfg, err := config.Parse(path, b)
		if err != nil {
			t.Errorf("%s does not load, and notConfig does not say why: %v", rel, err)
			return nil
		}
		files = append(files, rel)
		if len(cfg.Domains) > 0 {
			dirs[filepath.Dir(rel)] = true
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	for d := range dirs {
		files = append(files, d)
	}
	sort.Strings(files)
	if len(files) < 3 {
		t.Fatalf("found only %v under %s", files, examplesDir)
	}
	return files
}

const examplesDir = "../../examples"

// rebaseDone waits until Redis has seen serve record (SET) or drop (DEL,
// for a calendar window) the limits of each rule, the Rebase that serve
// runs at start and after a reload: on a calendar window it once crashed
// serve right after the DEL. The server's slow log must log every command.
func rebaseDone(t *testing.T, rc *redis.Client, prefix string, rules []config.Rule) {
	t.Helper()
	waitFor(t, "serve's Rebase of every rule", func() bool {
		seen := map[string]bool{}
		for _, e := range rc.SlowLogGet(context.Background(), -1).Val() {
			if len(e.Args) < 2 || !strings.HasSuffix(e.Args[1], ":rebase") || !strings.HasPrefix(e.Args[1], prefix) {
				continue
			}
			for _, r := range rules {
				// The service's keys of rule r start with r<len>:<name>:.
				if strings.Contains(e.Args[1], fmt.Sprintf("{r%d:%s:}", len(r.Name), r.Name)) {
					seen[r.Name] = true
				}
			}
		}
		return len(seen) == len(rules)
	})
}

// logEverything makes the Redis server's slow log keep every command.
func logEverything(t *testing.T, rc *redis.Client) {
	t.Helper()
	for _, kv := range [][2]string{{"slowlog-max-len", "1000000"}, {"slowlog-log-slower-than", "0"}} {
		if err := rc.ConfigSet(context.Background(), kv[0], kv[1]).Err(); err != nil {
			t.Fatal(err)
		}
	}
}

// limitedPaths returns the entries of every path from d to a descriptor
// with a limit, a wildcard value given a value it matches.
func limitedPaths(d *config.Descriptor, above []map[string]string) [][]map[string]string {
	var out [][]map[string]string
	for _, c := range d.Children {
		e := map[string]string{"key": c.Key, "value": "v"}
		if c.Value != "" {
			e["value"] = strings.TrimSuffix(c.Value, "*") + "v"
		}
		path := append(append([]map[string]string(nil), above...), e)
		if c.Limit != nil {
			out = append(out, path)
		}
		out = append(out, limitedPaths(c, path)...)
	}
	return out
}

// answers checks that in is ready and decides, on Redis, a check of every
// rule of cfg and a /json request of every limited descriptor of its
// domains.
func answers(t *testing.T, in *instance, cfg *config.Config) {
	t.Helper()
	alive(t, in)
	waitFor(t, "/readyz", func() bool { code, _ := in.get(t, "/readyz"); return code == 200 })
	for _, r := range cfg.Rules {
		code, body := in.post(t, "/v1/check", fmt.Sprintf(`{"rule":%q,"key":"e2e"}`, r.Name))
		if code != 200 || body["allowed"] != true || body["source"] != "store" {
			t.Errorf("check of rule %s: %d %v\n%s", r.Name, code, body, in.stderr)
		}
	}
	for name, d := range cfg.Domains {
		paths := limitedPaths(&d.Root, nil)
		if len(paths) == 0 {
			t.Errorf("domain %s: no descriptor with a limit", name)
		}
		for _, p := range paths {
			req, _ := json.Marshal(map[string]any{"domain": name, "descriptors": []any{map[string]any{"entries": p}}})
			code, body := in.post(t, "/json", string(req))
			if code != 200 || body["overallCode"] != "OK" {
				t.Errorf("/json %s: %d %v\n%s", req, code, body, in.stderr)
			}
		}
	}
}

// alive fails t at once if in has exited, with what it said.
func alive(t *testing.T, in *instance) {
	t.Helper()
	select {
	case err := <-in.done:
		t.Fatalf("floodgate serve exited: %v\n%s", err, in.stderr)
	default:
	}
}

// stopCleanly stops in with SIGTERM and fails t unless it exits 0 without
// a panic: a process that crashed meanwhile exits 2.
func stopCleanly(t *testing.T, in *instance) {
	t.Helper()
	if err := in.stop(t, syscall.SIGTERM); err != nil || strings.Contains(in.stderr.String(), "panic") {
		t.Fatalf("floodgate serve did not stay up: exit %v\n%s", err, in.stderr)
	}
}

// TestExamplesOnRedis serves every configuration of examples/ on a real
// redis-server: each starts, stays up through its Rebase at start (the
// calendar rule of examples/rules.yaml crashed it), is ready, and decides
// every rule and Envoy descriptor on Redis.
func TestExamplesOnRedis(t *testing.T) {
	srv := redistest.Start(t)
	rc := srv.Admin(t)
	logEverything(t, rc)
	for i, rel := range exampleConfigs(t) {
		t.Run(rel, func(t *testing.T) {
			path := filepath.Join(examplesDir, rel)
			cfg, err := config.Load(path)
			if err != nil {
				t.Fatal(err)
			}
			prefix := fmt.Sprintf("ex%d:", i)
			in := serve(t, "--redis", srv.URL()+"/0", "--redis-prefix", prefix, "--config", path, "--watch", "0", "--budget", "2s")
			rebaseDone(t, rc, prefix, cfg.Rules)
			answers(t, in, cfg)
			stopCleanly(t, in)
		})
	}
}

// TestReloadCalendarOnRedis reloads, with SIGHUP, a rules file into one
// whose rule becomes a calendar window and which adds another: the
// process survives the reload's Rebase and the new rules answer from
// Redis.
func TestReloadCalendarOnRedis(t *testing.T) {
	srv := redistest.Start(t)
	rc := srv.Admin(t)
	logEverything(t, rc)
	path := filepath.Join(t.TempDir(), "rules.yaml")
	writeFile(t, path, "rules:\n  - name: api\n    algorithm: token-bucket\n    rate: 10\n    period: 1m\n    burst: 10\n")
	in := serve(t, "--redis", srv.URL()+"/0", "--config", path, "--watch", "0", "--budget", "2s")
	cfg, err := config.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	rebaseDone(t, rc, "floodgate:", cfg.Rules)
	answers(t, in, cfg)

	writeFile(t, path, `rules:
  - name: api
    algorithm: fixed-window
    limit: 1000
    calendar: day
    timezone: Europe/Paris
  - name: weekly
    limits:
      - {algorithm: sliding-window, limit: 5, window: 1m}
      - {algorithm: fixed-window, limit: 70, calendar: week}
`)
	in.cmd.Process.Signal(syscall.SIGHUP)
	waitFor(t, "the reload", func() bool {
		return strings.Contains(in.metrics(t), `floodgate_config_reloads_total{result="success"} 1`)
	})
	// The reload's Rebase runs before serve reads its next signal, so a
	// clean exit on SIGTERM below says it returned.
	alive(t, in)
	code, body := in.post(t, "/v1/check", `{"rule":"api","key":"e2e"}`)
	if code != 200 || body["limit"] != 1000.0 || body["remaining"] != 999.0 || body["source"] != "store" {
		t.Errorf("check of the calendar rule after the reload: %d %v\n%s", code, body, in.stderr)
	}
	code, body = in.post(t, "/v1/check", `{"rule":"weekly","key":"e2e"}`)
	if code != 200 || body["allowed"] != true || body["source"] != "store" {
		t.Errorf("check of the added rule: %d %v\n%s", code, body, in.stderr)
	}
	if code, _ := in.get(t, "/readyz"); code != 200 {
		t.Errorf("/readyz after the reload: %d", code)
	}
	stopCleanly(t, in)
}
