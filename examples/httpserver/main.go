// Command httpserver is an HTTP server whose API is rate limited by
// floodgate's middleware: 5 requests per second per client IP with bursts
// of 10, and 1000 per hour, on the embedded store, or on Redis with a
// local fallback when -redis is given.
//
//	go run ./examples/httpserver
//	curl -i http://127.0.0.1:8080/hello
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/floodgate/floodgate"
	"github.com/floodgate/floodgate/fallback"
	"github.com/floodgate/floodgate/httplimit"
	"github.com/floodgate/floodgate/redisstore"
)

func main() {
	addr := flag.String("addr", "127.0.0.1:8080", "address to listen on")
	redisURL := flag.String("redis", "", "Redis URL (redis://host:port/db); the embedded store when empty")
	proxies := flag.String("trusted-proxies", "", "comma-separated addresses or CIDR prefixes whose X-Forwarded-For is believed")
	flag.Parse()
	if err := run(*addr, *redisURL, *proxies); err != nil {
		log.Fatal(err)
	}
}

func run(addr, redisURL, proxyList string) error {
	var store floodgate.Store = floodgate.NewMemoryStore(nil)
	if redisURL != "" {
		rs, err := redisstore.NewFromURL(redisURL, nil)
		if err != nil {
			return err
		}
		defer rs.Close()
		store = fallback.New(rs, nil)
	}
	defer store.Close()

	lim, err := floodgate.NewLimiter(store, []floodgate.Limit{
		floodgate.TokenBucket(5, time.Second, 10).Named("burst"),
		floodgate.FixedWindow(1000, time.Hour).Named("hourly"),
	}, nil)
	if err != nil {
		return err
	}
	var trusted []string
	if proxyList != "" {
		trusted = strings.Split(proxyList, ",")
	}
	prefixes, err := httplimit.TrustedProxies(trusted...)
	if err != nil {
		return err
	}
	mw := httplimit.New(lim, &httplimit.Options{
		Key:           httplimit.ClientIP(prefixes...),
		LegacyHeaders: true,
		Skip:          func(r *http.Request) bool { return r.URL.Path == "/healthz" },
	})

	mux := http.NewServeMux()
	mux.HandleFunc("/hello", func(w http.ResponseWriter, r *http.Request) { fmt.Fprintln(w, "hello") })
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, r *http.Request) { fmt.Fprintln(w, "ok") })
	srv := &http.Server{Addr: addr, Handler: mw.Handler(mux), ReadHeaderTimeout: 5 * time.Second}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	errc := make(chan error, 1)
	go func() { errc <- srv.ListenAndServe() }()
	log.Printf("listening on http://%s (try: curl -i http://%s/hello)", addr, addr)
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	shutdown, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := srv.Shutdown(shutdown); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}
