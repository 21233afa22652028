package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/floodgate/floodgate"
	"github.com/floodgate/floodgate/internal/server/config"
	"github.com/floodgate/floodgate/internal/server/envoy"
	"github.com/floodgate/floodgate/internal/server/httpapi"
	"github.com/floodgate/floodgate/internal/server/service"
)

func checkCmd(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("floodgate check", flag.ContinueOnError)
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), `Usage: floodgate check [flags] RULE KEY [COST]
       floodgate check --config FILE

Makes one decision and prints it as JSON; exits 0 when allowed, 1 when
denied, 2 on an error. With --server (http://host:port, or host:port for
plain HTTP) it asks a running floodgate serve. Otherwise it decides itself,
on --redis, shared with the services that use it, or without --redis on a
throwaway in-memory store: the decision starts from a full limit, nothing
is kept, and a line on stderr says so. With --config and no RULE it
validates the rules file and lists its rules.

Flags:
`)
		fs.PrintDefaults()
	}
	var sf storeFlags
	var e env
	sf.register(fs, &e)
	cfgPath := fs.String("config", e.str("FLOODGATE_CONFIG", ""), "rules file (YAML: floodgate rules or an envoyproxy/ratelimit domain), or a directory of them, read with the directories below it; the built-in example rule when empty ($FLOODGATE_CONFIG)")
	server := fs.String("server", e.str("FLOODGATE_SERVER", ""), "URL of a running floodgate serve, http://host:port or https://host:port; host:port means http ($FLOODGATE_SERVER)")
	token := fs.String("token", e.str("FLOODGATE_TOKEN", ""), "bearer token for --server ($FLOODGATE_TOKEN)")
	merge := fs.Bool("merge-domain-config", e.bool("MERGE_DOMAIN_CONFIG", false), mergeDomainsUsage)
	if code, ok := parseFlags(fs, &e, args, stderr); !ok {
		return code
	}
	load := config.LoadOptions{MergeDomains: *merge}
	if fs.NArg() == 0 && *cfgPath != "" && *server == "" {
		return validate(*cfgPath, load, stdout, stderr)
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
	var out []byte
	var allowed bool
	var err error
	if *server != "" {
		var base string
		if base, err = serverURL(*server); err == nil {
			out, allowed, err = checkRemote(ctx, base, *token, req)
		}
	} else {
		out, allowed, err = checkLocal(ctx, &sf, *cfgPath, load, req, stderr)
	}
	if err != nil {
		fmt.Fprintf(stderr, "floodgate check: %v\n", err)
		return 2
	}
	fmt.Fprintf(stdout, "%s\n", out)
	if allowed {
		return 0
	}
	return 1
}

// serverURL returns the base URL of the floodgate serve that --server
// names, without a trailing slash. A bare host:port means plain HTTP, as
// floodgate serve listens by default; anything that is not an http or
// https URL of a host is refused with what to write instead.
func serverURL(s string) (string, error) {
	raw := strings.TrimSpace(s)
	if !strings.Contains(raw, "://") {
		raw = "http://" + raw
	}
	u, err := url.Parse(raw)
	if err != nil || u.Scheme != "http" && u.Scheme != "https" || u.Host == "" || u.RawQuery != "" || u.Fragment != "" {
		return "", fmt.Errorf("--server %q is not the address of a floodgate serve: write http://host:port, https://host:port or host:port", s)
	}
	return strings.TrimSuffix(u.String(), "/"), nil
}

// checkRemote asks the floodgate serve at base, and returns its JSON
// answer.
func checkRemote(ctx context.Context, base, token string, req httpapi.CheckRequest) ([]byte, bool, error) {
	// json.Marshal would send U+FFFD for each bad byte, and the key
	// would share a bucket with others; the server refuses such bodies.
	for name, v := range map[string]string{"RULE": req.Rule, "KEY": req.Key} {
		if !utf8.ValidString(v) {
			return nil, false, fmt.Errorf("%s %q is not valid UTF-8, which the HTTP API requires; without --server, keys are any bytes", name, v)
		}
	}
	body, _ := json.Marshal(req)
	hr, err := http.NewRequestWithContext(ctx, "POST", base+"/v1/check", bytes.NewReader(body))
	if err != nil {
		return nil, false, err
	}
	hr.Header.Set("Content-Type", "application/json")
	if token != "" {
		hr.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(hr)
	if err != nil {
		// The url.Error's `Post "http://..."` says less than this.
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err
		}
		return nil, false, fmt.Errorf("no answer from %s: %w", base, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if resp.StatusCode != http.StatusOK {
		return nil, false, fmt.Errorf("%s: %s", resp.Status, strings.TrimSpace(string(b)))
	}
	var r httpapi.CheckResponse
	if err := json.Unmarshal(b, &r); err != nil {
		return nil, false, fmt.Errorf("the server's answer is not JSON: %w", err)
	}
	return bytes.TrimSpace(b), r.Allowed, nil
}

// checkLocal decides on the store the flags name, with the service that
// floodgate serve runs, and returns the answer as the server would.
func checkLocal(ctx context.Context, sf *storeFlags, cfgPath string, o config.LoadOptions, req httpapi.CheckRequest, stderr io.Writer) ([]byte, bool, error) {
	cfg, err := loadRules(cfgPath, o)
	if err != nil {
		return nil, false, fmt.Errorf("invalid rules file:\n%w", err)
	}
	log := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	st, err := openStore(sf, log, nil)
	if err != nil {
		return nil, false, err
	}
	defer st.close()
	if st.fallback == nil {
		// Nothing is shared or kept: say so, or a user takes a fresh
		// limit's answer for the state of the service's.
		fmt.Fprintln(stderr, "floodgate check: decided on a throwaway in-memory store (a full limit, nothing kept); use --server to ask a running floodgate serve, or --redis to decide on its Redis")
	}
	// Made as serve makes it, so that a domain serve would refuse fails
	// here too.
	rl, err := envoy.New(st.store, cfg, &service.Options{Fallback: st.fallback, Logger: log}, nil)
	if err != nil {
		return nil, false, err
	}
	svc := rl.Rules()
	cost := int64(1)
	if req.Cost != nil {
		cost = *req.Cost
	}
	d, err := svc.Check(ctx, req.Rule, req.Key, cost)
	if err != nil {
		return nil, false, err
	}
	out, err := json.Marshal(httpapi.NewCheckResponse(d))
	return out, d.Allowed, err
}

func validate(path string, o config.LoadOptions, stdout, stderr io.Writer) int {
	cfg, err := config.LoadWith(path, o)
	if err != nil {
		fmt.Fprintf(stderr, "%v\n", err)
		return 2
	}
	fmt.Fprintf(stdout, "%s: %d rules, %d envoy domains, valid\n", path, len(cfg.Rules), len(cfg.Domains))
	for _, r := range cfg.Rules {
		var ls []string
		for _, l := range r.Limits {
			if l.Name() == r.Name {
				l = l.Named("") // a one-limit rule's limit carries the rule's name
			}
			ls = append(ls, l.String())
		}
		var notes []string
		if r.Shadow {
			notes = append(notes, "shadow")
		}
		if r.OnChange != floodgate.Additive {
			notes = append(notes, "on_change "+r.OnChange.String())
		}
		note := ""
		if notes != nil {
			note = " (" + strings.Join(notes, ", ") + ")"
		}
		fmt.Fprintf(stdout, "  %s%s: %s\n", r.Name, note, strings.Join(ls, "; "))
	}
	printDomains(stdout, cfg, "  ")
	return 0
}

// printDomains lists cfg's Envoy domains in name order, each with its
// file (the line after indent) and its limits.
func printDomains(w io.Writer, cfg *config.Config, indent string) {
	for _, name := range slices.Sorted(maps.Keys(cfg.Domains)) {
		d := cfg.Domains[name]
		fmt.Fprintf(w, "%sdomain %s (%s):\n", indent, name, d.File)
		printDescriptors(w, &d.Root)
	}
}

// printDescriptors lists a domain's limits, one line each, in name order.
func printDescriptors(w io.Writer, n *config.Descriptor) {
	for _, name := range slices.Sorted(maps.Keys(n.Children)) {
		c := n.Children[name]
		if l := c.Limit; l != nil {
			what := "unlimited"
			switch {
			case l.Unlimited:
			case l.Limit == (floodgate.Limit{}):
				what = fmt.Sprintf("0 per %s: every hit is over the limit", strings.ToLower(l.Unit.String()))
			case l.Counting:
				what = fmt.Sprintf("%d per %s (envoyproxy/ratelimit's fixed window)", l.RequestsPerUnit, l.Limit.Period())
			default:
				what = l.Limit.String()
			}
			fmt.Fprintf(w, "    %s: %s\n", c.Path, what)
		}
		printDescriptors(w, c)
	}
}
