package main

import (
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"sort"
	"time"

	"github.com/floodgate/floodgate/internal/lib/lograte"
	"github.com/floodgate/floodgate/internal/server/envoy"
)

// extraHTTP is an HTTP listener of the ratelimit mode, beside serve's
// own.
type extraHTTP struct {
	name, what string // the listener's name in logs, and what it serves
	ln         net.Listener
	srv        *http.Server
}

// listenUpstream opens envoyproxy/ratelimit's other listeners: the debug
// port (DEBUG_PORT) and, with USE_PROMETHEUS, Prometheus's.
func (s *server) listenUpstream(u *upstream, rl *envoy.Service, log *slog.Logger) error {
	add := func(name, what, addr string, h http.Handler) error {
		ln, err := net.Listen("tcp", addr)
		if err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
		s.extra = append(s.extra, extraHTTP{name: name, what: what, ln: ln, srv: &http.Server{
			Handler:           h,
			ErrorLog:          slog.NewLogLogger(lograte.NewHandler(log.With("component", name).Handler(), time.Second, nil), slog.LevelWarn),
			ReadHeaderTimeout: 10 * time.Second, ReadTimeout: 30 * time.Second, IdleTimeout: 2 * time.Minute, MaxHeaderBytes: 64 << 10,
		}})
		return nil
	}
	if err := add("debug", "Debug endpoints (/rlconfig, /stats)", u.admin, debugHandler(rl)); err != nil {
		return fmt.Errorf("$DEBUG_HOST:$DEBUG_PORT: %w", err)
	}
	if u.prometheus != "" {
		mux := http.NewServeMux()
		mux.Handle("GET "+u.prometheusPath, metricsHandler(rl))
		if err := add("prometheus", "Prometheus metrics ("+u.prometheusPath+")", u.prometheus, mux); err != nil {
			return fmt.Errorf("$PROMETHEUS_ADDR: %w", err)
		}
	}
	return nil
}

func metricsHandler(rl *envoy.Service) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
		rl.Rules().Metrics.Write(w)
	})
}

// debugEndpoints are the debug listener's endpoints, as its root lists
// them.
var debugEndpoints = map[string]string{
	"/rlconfig":    "print out the currently loaded configuration for debugging",
	"/stats":       "print out stats (floodgate's Prometheus metrics)",
	"/healthcheck": "OK while serving",
}

// debugHandler serves envoyproxy/ratelimit's debug port: the list of
// endpoints at /, the configuration in use at /rlconfig, the statistics
// at /stats. It has no pprof endpoints.
func debugHandler(rl *envoy.Service) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /rlconfig", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		printDomains(w, rl.Rules().Config(), "")
	})
	mux.Handle("GET /stats", metricsHandler(rl))
	mux.HandleFunc("GET /healthcheck", func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "OK") })
	mux.HandleFunc("GET /{$}", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		paths := make([]string, 0, len(debugEndpoints))
		for p := range debugEndpoints {
			paths = append(paths, p)
		}
		sort.Strings(paths)
		for _, p := range paths {
			fmt.Fprintf(w, "%s: %s\n", p, debugEndpoints[p])
		}
	})
	return mux
}
