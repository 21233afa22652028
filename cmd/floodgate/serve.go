package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"sync"
	"syscall"
	"time"

	"github.com/floodgate/floodgate"
	"github.com/floodgate/floodgate/fallback"
	"github.com/floodgate/floodgate/internal/httpapi"
	"github.com/floodgate/floodgate/internal/resp"
	"github.com/floodgate/floodgate/internal/service"
	"github.com/floodgate/floodgate/redisstore"
	"github.com/redis/go-redis/v9"
)

// openStore returns the store the flags ask for, the fallback store when
// it is Redis, a description, and a func that closes everything.
func openStore(f *storeFlags, log *slog.Logger) (floodgate.Store, *fallback.Store, string, func(), error) {
	if f.redis == "" && f.cluster == "" {
		s := floodgate.NewMemoryStore(nil)
		return s, nil, "embedded in-memory store", func() { s.Close() }, nil
	}
	policy, err := fallback.ParsePolicy(f.policy)
	if err != nil {
		return nil, nil, "", nil, err
	}
	var client redis.UniversalClient
	desc := ""
	if f.cluster != "" {
		client = redis.NewClusterClient(&redis.ClusterOptions{Addrs: splitList(f.cluster), ContextTimeoutEnabled: true})
		desc = "Redis Cluster " + f.cluster
	} else {
		o, err := redis.ParseURL(f.redis)
		if err != nil {
			return nil, nil, "", nil, fmt.Errorf("--redis: %w", err)
		}
		o.ContextTimeoutEnabled = true
		client = redis.NewClient(o)
		desc = "Redis at " + o.Addr
	}
	rs := redisstore.New(client, &redisstore.Options{Prefix: f.prefix})
	fb := fallback.New(rs, &fallback.Options{Policy: policy, Instances: f.instances, Budget: f.budget, Logger: log})
	desc += fmt.Sprintf(" (fallback %s, %d instances, budget %s)", policy, f.instances, f.budget)
	return fb, fb, desc, func() { fb.Close(); rs.Close(); client.Close() }, nil
}

func serveCmd(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("floodgate serve", flag.ContinueOnError)
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "Usage: floodgate serve [flags]\n\nRuns the rate limit service: an HTTP/JSON API with /metrics, and the Redis\nprotocol (CL.THROTTLE, FG.CHECK). With no flags it uses the embedded store\nand a built-in rule, \"example\" (10/s, burst 20). Every flag can also be set\nwith the environment variable named in its description.\n\nFlags:\n")
		fs.PrintDefaults()
	}
	var sf storeFlags
	sf.register(fs)
	cfgPath := fs.String("config", envOr("FLOODGATE_CONFIG", ""), "rules file (YAML); reloaded on SIGHUP and when it changes ($FLOODGATE_CONFIG)")
	httpAddr := fs.String("http", envOr("FLOODGATE_HTTP", "127.0.0.1:8080"), "HTTP API address; empty to disable ($FLOODGATE_HTTP)")
	respAddr := fs.String("resp", envOr("FLOODGATE_RESP", "127.0.0.1:6380"), "Redis protocol address; empty to disable ($FLOODGATE_RESP)")
	token := fs.String("token", envOr("FLOODGATE_TOKEN", ""), "require this bearer token on the HTTP API and AUTH on the Redis protocol ($FLOODGATE_TOKEN)")
	watch := fs.Duration("watch", envDuration("FLOODGATE_WATCH", time.Second), "how often to look for a changed rules file; 0 to rely on SIGHUP ($FLOODGATE_WATCH)")
	if code, ok := parseFlags(fs, args, stderr); !ok {
		return code
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "floodgate serve: unexpected argument %q\n", fs.Arg(0))
		return 2
	}
	log := slog.New(slog.NewTextHandler(stderr, nil))

	mod := stamp(*cfgPath) // before reading, so that no change is missed
	cfg, err := loadRules(*cfgPath)
	if err != nil {
		fmt.Fprintf(stderr, "floodgate serve: invalid rules file:\n%v\n", err)
		return 2
	}
	store, fb, desc, closeStore, err := openStore(&sf, log)
	if err != nil {
		fmt.Fprintf(stderr, "floodgate serve: %v\n", err)
		return 2
	}
	defer closeStore()
	svc := service.New(store, fb, cfg, log)

	var (
		httpLn, respLn net.Listener
		httpSrv        *http.Server
		respSrv        *resp.Server
		wg             sync.WaitGroup
		serveErr       = make(chan error, 2)
	)
	if *httpAddr != "" {
		if httpLn, err = net.Listen("tcp", *httpAddr); err != nil {
			fmt.Fprintf(stderr, "floodgate serve: --http: %v\n", err)
			return 2
		}
		httpSrv = &http.Server{
			Handler:           httpapi.Handler(svc, httpapi.Options{Token: *token, Logger: log}),
			ReadHeaderTimeout: 10 * time.Second, ReadTimeout: 30 * time.Second, IdleTimeout: 2 * time.Minute,
			MaxHeaderBytes: 64 << 10,
		}
	}
	if *respAddr != "" {
		if respLn, err = net.Listen("tcp", *respAddr); err != nil {
			if httpLn != nil {
				httpLn.Close()
			}
			fmt.Fprintf(stderr, "floodgate serve: --resp: %v\n", err)
			return 2
		}
		respSrv = resp.New(svc, *token, getVersion(), log)
	}
	if httpLn == nil && respLn == nil {
		fmt.Fprintln(stderr, "floodgate serve: both --http and --resp are disabled: nothing to serve")
		return 2
	}

	fmt.Fprintf(stdout, "floodgate %s\n", getVersion())
	fmt.Fprintf(stdout, "store: %s\n", desc)
	fmt.Fprintf(stdout, "rules: %d from %s\n", len(cfg.Rules), cfg.Source)
	if httpLn != nil {
		fmt.Fprintf(stdout, "HTTP API on http://%s (POST /v1/check, GET /v1/rules, /metrics)\n", httpLn.Addr())
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := httpSrv.Serve(httpLn); err != nil && !errors.Is(err, http.ErrServerClosed) {
				serveErr <- fmt.Errorf("HTTP: %w", err)
			}
		}()
	}
	if respLn != nil {
		fmt.Fprintf(stdout, "Redis protocol on %s (CL.THROTTLE, FG.CHECK)\n", respLn.Addr())
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := respSrv.Serve(respLn); err != nil {
				serveErr <- fmt.Errorf("RESP: %w", err)
			}
		}()
	}
	if f, ok := stdout.(interface{ Sync() error }); ok {
		f.Sync()
	}

	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGHUP, syscall.SIGINT, syscall.SIGTERM)
	defer signal.Stop(sigs)
	stopWatch := make(chan struct{})
	var watchWG sync.WaitGroup
	if *cfgPath != "" && *watch > 0 {
		watchWG.Add(1)
		go func() {
			defer watchWG.Done()
			watchFile(*cfgPath, mod, *watch, stopWatch, func() { svc.Reload(*cfgPath) })
		}()
	}

	code := 0
loop:
	for {
		select {
		case sig := <-sigs:
			if sig == syscall.SIGHUP {
				if *cfgPath == "" {
					log.Info("floodgate: SIGHUP without --config: nothing to reload")
					continue
				}
				svc.Reload(*cfgPath)
				continue
			}
			log.Info("floodgate: shutting down", "signal", sig.String())
			break loop
		case err := <-serveErr:
			log.Error("floodgate: server failed", "error", err.Error())
			code = 1
			break loop
		case <-ctx.Done():
			break loop
		}
	}
	close(stopWatch)
	watchWG.Wait()
	shutdown, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if httpSrv != nil {
		httpSrv.Shutdown(shutdown)
	}
	if respSrv != nil {
		respSrv.Shutdown(shutdown)
	}
	wg.Wait()
	return code
}

// fileStamp is what watchFile compares: a file's modification time and
// size.
type fileStamp struct {
	mod  time.Time
	size int64
}

func stamp(path string) fileStamp {
	fi, err := os.Stat(path)
	if err != nil {
		return fileStamp{size: -1}
	}
	return fileStamp{fi.ModTime(), fi.Size()}
}

// watchFile calls changed whenever the file's stamp differs from the last
// one seen (first last), every interval, until stop is closed.
func watchFile(path string, last fileStamp, interval time.Duration, stop <-chan struct{}, changed func()) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-stop:
			return
		case <-t.C:
		}
		if now := stamp(path); now.size >= 0 && (now.size != last.size || !now.mod.Equal(last.mod)) {
			last = now
			changed()
		}
	}
}
