package main

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/floodgate/floodgate/internal/config"
	"github.com/floodgate/floodgate/internal/httpapi"
	"github.com/floodgate/floodgate/internal/service"
)

func checkCmd(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("floodgate check", flag.ContinueOnError)
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), `Usage: floodgate check [flags] RULE KEY [COST]
       floodgate check --config FILE

Makes one decision and prints it as JSON; exits 0 when allowed, 1 when
denied, 2 on an error. With --server it asks a running floodgate serve;
otherwise it decides itself, on --redis (shared with the services using it)
or on a fresh in-memory store. With --config and no RULE it validates the
rules file and lists its rules.

Flags:
`)
		fs.PrintDefaults()
	}
	var sf storeFlags
	sf.register(fs)
	cfgPath := fs.String("config", envOr("FLOODGATE_CONFIG", ""), "rules file (YAML); the built-in example rule when empty ($FLOODGATE_CONFIG)")
	server := fs.String("server", envOr("FLOODGATE_SERVER", ""), "URL of a running floodgate serve, http://host:port ($FLOODGATE_SERVER)")
	token := fs.String("token", envOr("FLOODGATE_TOKEN", ""), "bearer token for --server ($FLOODGATE_TOKEN)")
	if code, ok := parseFlags(fs, args, stderr); !ok {
		return code
	}
	if fs.NArg() == 0 && *cfgPath != "" && *server == "" {
		return validate(*cfgPath, stdout, stderr)
	}
	if fs.NArg() < 2 || fs.NArg() > 3 {
		fs.Usage()
		return 2
	}
	req := httpapi.CheckRequest{Rule: fs.Arg(0), Key: fs.Arg(1)}
	if fs.NArg() == 3 {
		c, err := strconv.ParseInt(fs.Arg(2), 10, 64)
		if err != nil {
			fmt.Fprintf(stderr, "floodgate check: COST must be a whole number, got %q\n", fs.Arg(2))
			return 2
		}
		req.Cost = &c
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	var out json.RawMessage
	var allowed bool
	if *server != "" {
		body, _ := json.Marshal(req)
		hr, _ := http.NewRequestWithContext(ctx, "POST", strings.TrimSuffix(*server, "/")+"/v1/check", bytes.NewReader(body))
		hr.Header.Set("Content-Type", "application/json")
		if *token != "" {
			hr.Header.Set("Authorization", "Bearer "+*token)
		}
		resp, err := http.DefaultClient.Do(hr)
		if err != nil {
			fmt.Fprintf(stderr, "floodgate check: %v\n", err)
			return 2
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
		if resp.StatusCode != http.StatusOK {
			fmt.Fprintf(stderr, "floodgate check: %s: %s\n", resp.Status, strings.TrimSpace(string(b)))
			return 2
		}
		var r httpapi.CheckResponse
		if err := json.Unmarshal(b, &r); err != nil {
			fmt.Fprintf(stderr, "floodgate check: the server's answer is not JSON: %v\n", err)
			return 2
		}
		out, allowed = bytes.TrimSpace(b), r.Allowed
	} else {
		cfg, err := loadRules(*cfgPath)
		if err != nil {
			fmt.Fprintf(stderr, "floodgate check: invalid rules file:\n%v\n", err)
			return 2
		}
		log := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
		store, fb, _, closeStore, err := openStore(&sf, log)
		if err != nil {
			fmt.Fprintf(stderr, "floodgate check: %v\n", err)
			return 2
		}
		defer closeStore()
		svc := service.New(store, fb, cfg, log)
		rec := &recorder{header: http.Header{}}
		body, _ := json.Marshal(req)
		hr, _ := http.NewRequestWithContext(ctx, "POST", "/v1/check", bytes.NewReader(body))
		httpapi.Handler(svc, httpapi.Options{Logger: log}).ServeHTTP(rec, hr)
		if rec.status != http.StatusOK {
			fmt.Fprintf(stderr, "floodgate check: %s\n", strings.TrimSpace(rec.body.String()))
			return 2
		}
		var r httpapi.CheckResponse
		json.Unmarshal(rec.body.Bytes(), &r)
		out, allowed = bytes.TrimSpace(rec.body.Bytes()), r.Allowed
	}
	fmt.Fprintf(stdout, "%s\n", out)
	if allowed {
		return 0
	}
	return 1
}

// recorder is a minimal http.ResponseWriter for answering locally with
// the same handler the service uses.
type recorder struct {
	header http.Header
	status int
	body   bytes.Buffer
}

func (r *recorder) Header() http.Header { return r.header }
func (r *recorder) Write(b []byte) (int, error) {
	if r.status == 0 {
		r.status = http.StatusOK
	}
	return r.body.Write(b)
}
func (r *recorder) WriteHeader(s int) { r.status = s }

func validate(path string, stdout, stderr io.Writer) int {
	cfg, err := config.Load(path)
	if err != nil {
		fmt.Fprintf(stderr, "%v\n", err)
		return 2
	}
	fmt.Fprintf(stdout, "%s: %d rules, valid\n", path, len(cfg.Rules))
	for _, r := range cfg.Rules {
		var ls []string
		for _, l := range r.Limits {
			if l.Name() == r.Name {
				l = l.Named("") // a one-limit rule's limit carries the rule's name
			}
			ls = append(ls, l.String())
		}
		shadow := ""
		if r.Shadow {
			shadow = " (shadow)"
		}
		fmt.Fprintf(stdout, "  %s%s: %s\n", r.Name, shadow, strings.Join(ls, "; "))
	}
	return 0
}
