// Command floodgate runs the floodgate rate limit service, and checks
// limits from the command line.
//
//	floodgate serve     run the service (HTTP/JSON API, Redis protocol, metrics)
//	floodgate check     one decision, or validate a rules file
//	floodgate version   print the version
//
// Run "floodgate <command> --help" for the flags of each.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"runtime/debug"
	"strconv"
	"strings"
	"time"

	"github.com/floodgate/floodgate/internal/config"
)

// version is set at build time with -ldflags "-X main.version=v1.2.3";
// otherwise it comes from the module's build information.
var version = ""

func getVersion() string {
	if version != "" {
		return version
	}
	if bi, ok := debug.ReadBuildInfo(); ok && bi.Main.Version != "" && bi.Main.Version != "(devel)" {
		return bi.Main.Version
	}
	return "devel"
}

const usage = `floodgate: a distributed rate limiter

Usage:
  floodgate serve   [flags]          run the service (go run ./cmd/floodgate serve)
  floodgate check   [flags] RULE KEY [COST]
                                     one decision, printed as JSON
  floodgate check   --config FILE    validate a rules file and list its rules
  floodgate version                  print the version

Run "floodgate <command> --help" for the flags of a command.
`

func main() {
	os.Exit(run(context.Background(), os.Args[1:], os.Stdout, os.Stderr))
}

// run runs the command line args and returns the exit status: 0 success
// (or allowed), 1 denied, 2 usage or runtime error.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return 2
	}
	switch args[0] {
	case "serve":
		return serveCmd(ctx, args[1:], stdout, stderr)
	case "check":
		return checkCmd(ctx, args[1:], stdout, stderr)
	case "version", "--version", "-version":
		fmt.Fprintln(stdout, "floodgate", getVersion())
		return 0
	case "help", "-h", "--help", "-help":
		fmt.Fprint(stdout, usage)
		return 0
	}
	fmt.Fprintf(stderr, "floodgate: unknown command %q\n\n%s", args[0], usage)
	return 2
}

// envOr returns $name, or def when it is unset.
func envOr(name, def string) string {
	if v, ok := os.LookupEnv(name); ok {
		return v
	}
	return def
}

func envInt(name string, def int64) int64 {
	if v, ok := os.LookupEnv(name); ok {
		if i, err := strconv.ParseInt(v, 10, 64); err == nil {
			return i
		}
	}
	return def
}

func envDuration(name string, def time.Duration) time.Duration {
	if v, ok := os.LookupEnv(name); ok {
		if d, err := time.ParseDuration(v); err == nil {
			return d
		}
	}
	return def
}

// storeFlags are the flags that choose and tune the store.
type storeFlags struct {
	redis     string
	cluster   string
	prefix    string
	policy    string
	instances int64
	budget    time.Duration
}

func (s *storeFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&s.redis, "redis", envOr("FLOODGATE_REDIS", ""), "Redis URL, redis://[user:password@]host:port[/db] or rediss:// ($FLOODGATE_REDIS); the embedded in-memory store when empty")
	fs.StringVar(&s.cluster, "redis-cluster", envOr("FLOODGATE_REDIS_CLUSTER", ""), "comma-separated Redis Cluster nodes, host:port,... ($FLOODGATE_REDIS_CLUSTER)")
	fs.StringVar(&s.prefix, "redis-prefix", envOr("FLOODGATE_REDIS_PREFIX", "floodgate:"), "prefix of every Redis key ($FLOODGATE_REDIS_PREFIX)")
	fs.StringVar(&s.policy, "fallback", envOr("FLOODGATE_FALLBACK", "local"), "what to answer while Redis fails: local, fail-open or fail-closed ($FLOODGATE_FALLBACK)")
	fs.Int64Var(&s.instances, "instances", envInt("FLOODGATE_INSTANCES", 1), "how many floodgate instances share Redis; each one's local fallback gets 1/instances of each limit ($FLOODGATE_INSTANCES)")
	fs.DurationVar(&s.budget, "budget", envDuration("FLOODGATE_BUDGET", 50*time.Millisecond), "longest wait for Redis per decision before the fallback answers ($FLOODGATE_BUDGET)")
}

func parseFlags(fs *flag.FlagSet, args []string, stderr io.Writer) (int, bool) {
	fs.SetOutput(stderr)
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0, false
		}
		return 2, false
	}
	return 0, true
}

func splitList(s string) []string {
	var out []string
	for _, p := range strings.Split(s, ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}

// loadRules returns the rules of the file at path, or the built-in example
// rule when path is empty.
func loadRules(path string) (*config.Config, error) {
	if path == "" {
		return config.Example(), nil
	}
	return config.Load(path)
}
