// Command floodgate runs the floodgate rate limit service, and checks
// limits from the command line.
//
//	floodgate serve     run the service (HTTP/JSON API, Redis protocol, metrics)
//	floodgate check     one decision, or validate a rules file
//	floodgate version   print the version and commit (also --version)
//
// Run "floodgate <command> --help" for the flags of each.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/floodgate/floodgate/internal/server/config"
	"github.com/redis/go-redis/v9"
	"google.golang.org/grpc/grpclog"
)

const usage = `floodgate: a distributed rate limiter

Usage:
  floodgate serve   [flags]          run the service (go run ./cmd/floodgate serve)
  floodgate check   [flags] RULE KEY [COST]
                                     one decision, printed as JSON
  floodgate check   --config FILE    validate a rules file and list its rules
  floodgate version                  print the version and the commit it was built from

Run "floodgate <command> --help" for the flags of a command.

Started under the name ratelimit (a link to this binary), floodgate takes
no flags and reads envoyproxy/ratelimit's environment instead (RUNTIME_ROOT,
REDIS_URL, PORT, GRPC_PORT, ...): see docs/envoy.md.
`

func main() {
	// go-redis and grpc-go have one logger each for the process: set here,
	// once, before any call, they send their lines through floodgate's
	// log, rate-limited; serve points them at the logger its flags
	// configure.
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	rl, gl := newRedisLogger(log), newGRPCLogger(log, nil)
	redis.SetLogger(rl)
	grpclog.SetLoggerV2(gl)
	use := func(l *slog.Logger) {
		rl.use(l)
		gl.use(l)
	}
	// Started as ratelimit (the image's /bin/ratelimit, a link to this
	// binary): envoyproxy/ratelimit's drop-in, configured by its
	// environment.
	if filepath.Base(os.Args[0]) == ratelimitName {
		os.Exit(ratelimitCmd(context.Background(), os.Args[1:], os.Stdout, os.Stderr, use))
	}
	os.Exit(runWith(context.Background(), os.Args[1:], os.Stdout, os.Stderr, use))
}

// run runs the command line args and returns the exit status: 0 success
// (or allowed), 1 denied, 2 usage or runtime error.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	return runWith(ctx, args, stdout, stderr, nil)
}

// runWith is run, where serve hands its logger to redisLog, when set:
// main's, which owns go-redis's and grpc-go's loggers for the process.
func runWith(ctx context.Context, args []string, stdout, stderr io.Writer, redisLog func(*slog.Logger)) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return 2
	}
	switch args[0] {
	case "serve":
		return serveCmd(ctx, args[1:], stdout, stderr, redisLog)
	case "check":
		return checkCmd(ctx, args[1:], stdout, stderr)
	case "version", "--version", "-version":
		fmt.Fprintln(stdout, "floodgate", versionLine())
		return 0
	case "help", "-h", "--help", "-help":
		fmt.Fprint(stdout, usage)
		return 0
	}
	fmt.Fprintf(stderr, "floodgate: unknown command %q\n\n%s", args[0], usage)
	return 2
}

// env reads flag defaults from FLOODGATE_* environment variables, and
// keeps every malformed value as an error naming the variable, so that a
// typo in a deployment fails at start instead of being ignored.
type env struct{ errs []error }

// str returns $name, or def when it is unset.
func (e *env) str(name, def string) string {
	if v, ok := os.LookupEnv(name); ok {
		return v
	}
	return def
}

// int returns $name as a whole number, or def when it is unset.
func (e *env) int(name string, def int64) int64 {
	return parseEnv(e, name, def, "a whole number", func(v string) (int64, error) { return strconv.ParseInt(v, 10, 64) })
}

// bool returns $name as a boolean (1, t, true, 0, f, false, ...), or def
// when it is unset.
func (e *env) bool(name string, def bool) bool {
	return parseEnv(e, name, def, "true or false", strconv.ParseBool)
}

// duration returns $name as a duration ("50ms", "1s"), or def when it is
// unset.
func (e *env) duration(name string, def time.Duration) time.Duration {
	return parseEnv(e, name, def, "a duration (like 50ms or 1s)", time.ParseDuration)
}

// parseEnv returns $name parsed by parse, or def when it is unset or
// malformed; a malformed value is kept as an error saying it is not what.
func parseEnv[T any](e *env, name string, def T, what string, parse func(string) (T, error)) T {
	v, ok := os.LookupEnv(name)
	if !ok {
		return def
	}
	x, err := parse(strings.TrimSpace(v))
	if err != nil {
		e.errs = append(e.errs, fmt.Errorf("$%s: %q is not %s", name, v, what))
		return def
	}
	return x
}

// err returns the malformed variables as one error, or nil.
func (e *env) err() error { return errors.Join(e.errs...) }

// parseFlags parses args into fs, after the environment e gave the
// defaults. It returns the exit status and false when the command should
// stop: for --help, a bad flag or a malformed environment variable.
func parseFlags(fs *flag.FlagSet, e *env, args []string, stderr io.Writer) (int, bool) {
	fs.SetOutput(stderr)
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0, false
		}
		return 2, false
	}
	if err := e.err(); err != nil {
		fmt.Fprintf(stderr, "%s: %v\n", fs.Name(), err)
		return 2, false
	}
	return 0, true
}

// loadRules returns the rules of the file or directory at path, or the
// built-in example rule when path is empty.
func loadRules(path string, o config.LoadOptions) (*config.Config, error) {
	if path == "" {
		return config.Example(), nil
	}
	return config.LoadWith(path, o)
}

// mergeDomainsUsage is the --merge-domain-config flag's description, the
// same in serve and check.
const mergeDomainsUsage = "a configuration directory may hold one Envoy domain in several files, whose top-level descriptors are merged ($MERGE_DOMAIN_CONFIG, as envoyproxy/ratelimit names it)"
