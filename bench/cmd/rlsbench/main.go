// Command rlsbench measures Envoy's rate limit API, ShouldRateLimit over
// gRPC, side by side: floodgate serve --grpc against envoyproxy/ratelimit
// (built from its Go module), both as processes of their own, on one
// redis-server that this program starts, with the same domain file and
// the same load.
//
//	cd bench && go run ./cmd/rlsbench [-duration 3s] [-runs 3] [-callers 1,64] [-descriptors 1,3] [-client envoy|grpc] [-atomic]
//
// Cells: 1 and 64 concurrent callers (gRPC streams on one connection, as
// Envoy multiplexes them), one and three descriptors per request, over
// 10,000 client addresses, every call with Envoy's default deadline of
// 20ms (see envoyTimeout). Each cell runs the two services in turn, runs
// times, and reports medians: decisions per second, p50 and p99 latency,
// the CPU time the service's process and redis-server spent per request
// (from /proc: the load generator shares the machine's cores, so this is
// each service's own cost), and the share of answers over the limit.
//
// The load generator is, by default, Envoy-like (see h2.go): one event
// loop keeps the callers' streams in flight, as an Envoy worker thread
// does. -client grpc sends the same calls through a gRPC-Go client, a
// goroutine per caller, which takes more of the shared cores per request
// (docs/performance.md has both, side by side).
//
// -atomic runs both services with envoyproxy/ratelimit's
// STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT (floodgate's
// --stop-cache-key-increment-when-overlimit): a request over the limit on
// any descriptor charges none of them.
package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"log"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"sort"
	"strconv"
	"sync"
	"syscall"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rls "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/floodgate/floodgate/bench/internal/flags"
	"github.com/floodgate/floodgate/bench/internal/procs"
	"github.com/floodgate/floodgate/internal/lib/gcfloor"
	"github.com/floodgate/floodgate/internal/testkit/peertest"
)

// domain is the configuration both services load: three descriptors, each
// a per-second fixed window high enough that the load stays mostly within
// it, with one (the path) shared by every request so that it goes over.
const domain = `domain: bench
descriptors:
  - key: remote_address
    rate_limit: {unit: second, requests_per_unit: 50}
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 1000}
  - key: path
    rate_limit: {unit: second, requests_per_unit: 5000}
`

func main() {
	duration := flag.Duration("duration", 3*time.Second, "length of one run of one cell")
	runs := flag.Int("runs", 3, "runs per service and cell; medians are reported")
	port := flag.Int("port", 0, "loopback port for the redis-server this program starts (0: a free one)")
	callerList := flag.String("callers", "1,64", "the numbers of concurrent callers to measure, comma-separated")
	descList := flag.String("descriptors", "1,3", "the numbers of descriptors per request to measure, comma-separated (1 or 3)")
	client := flag.String("client", "envoy", "the load generator: envoy (one event loop, every caller a stream on one connection, as Envoy calls) or grpc (a gRPC-Go client, a goroutine per caller)")
	atomic := flag.Bool("atomic", false, "run both services with STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT: a request over the limit on any descriptor charges none of them")
	flag.Parse()
	callerCounts, descCounts := flags.Counts("-callers", *callerList), flags.Counts("-descriptors", *descList)
	run := generators[*client]
	if run == nil {
		log.Fatalf("-client: %q: envoy or grpc", *client)
	}
	for _, n := range descCounts {
		if n != 1 && n != 3 {
			log.Fatalf("-descriptors: %d: the requests have 1 or 3 descriptors", n)
		}
	}

	// What this program starts is stopped on every way out: the end of
	// main, a failure (see stops), and SIGINT or SIGTERM.
	defer stops.Run()
	stops.OnSignal()

	// The load generator shares the machine's two cores with the service it
	// measures: with Go's default GC, marking its small heap took about a
	// tenth of its CPU at 64 callers (perf), taken from both services
	// alike. floodgate serve's floor (see gcfloor) keeps that down.
	defer gcfloor.Start(64 << 20).Stop()
	stolen := procs.ReadStolen()
	defer func() { fmt.Printf("\n%s\n", stolen.Note()) }()
	redisAddr := procs.StartRedis(&stops, *port)
	dir, err := os.MkdirTemp("", "rlsbench")
	check(err)
	stops.Add(func() { os.RemoveAll(dir) })

	peerBin, err := peertest.BuildRatelimit()
	check(err)
	peerVersion, err := peertest.Version() // the default's, or FLOODGATE_RATELIMIT_VERSION's
	check(err)
	var peerEnv, fgFlags []string
	if *atomic {
		peerEnv = []string{"STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT=true"}
		fgFlags = []string{"--stop-cache-key-increment-when-overlimit"}
	}
	peer, err := peertest.StartRatelimit(peerBin, filepath.Join(dir, "peer"), redisAddr, map[string]string{"bench.yaml": domain}, freePort, peerEnv...)
	check(err)
	stops.Add(peer.Stop)
	fgAddr, fgPID := startFloodgate(dir, redisAddr, fgFlags...)
	redisPID := procs.RedisPID(&stops, redisAddr)

	mode := ""
	if *atomic {
		mode = "; STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT on both"
	}
	fmt.Printf("%s, %d CPUs, redis-server on loopback; envoyproxy/ratelimit %s; the %s load generator; %d runs of %s per cell, medians%s\n\n",
		runtime.GOOS+"/"+runtime.GOARCH, runtime.NumCPU(), peerVersion, *client, *runs, *duration, mode)
	fmt.Printf("| callers | descriptors | service | requests/s | p50 | p99 | service CPU per request | redis-server CPU per request | load generator CPU per request | over the limit | past the 20ms deadline (all runs) | floodgate / envoyproxy/ratelimit (requests/s) |\n|---|---|---|---|---|---|---|---|---|---|---|---|\n")
	targets := []struct {
		name, addr string
		pid        int
	}{{"envoyproxy/ratelimit", peer.GRPC, peer.PID()}, {"floodgate", fgAddr, fgPID}}
	for _, callers := range callerCounts {
		for _, descs := range descCounts {
			var results [2][]result
			for range *runs {
				for i, tg := range targets {
					cpu0, rcpu0, gcpu0 := procs.CPU(&stops, tg.pid), procs.CPU(&stops, redisPID), procs.CPU(&stops, os.Getpid())
					r := run(tg.addr, callers, descs, *duration)
					if r.n > 0 {
						r.cpu = (procs.CPU(&stops, tg.pid) - cpu0) / time.Duration(r.n)
						r.redisCPU = (procs.CPU(&stops, redisPID) - rcpu0) / time.Duration(r.n)
						r.genCPU = (procs.CPU(&stops, os.Getpid()) - gcpu0) / time.Duration(r.n)
					}
					results[i] = append(results[i], r)
				}
			}
			var med [2]result
			for i := range targets {
				med[i] = median(results[i])
			}
			for i, tg := range targets {
				ratio := ""
				if i == 1 {
					ratio = fmt.Sprintf("%.2f×", med[1].rate/med[0].rate)
				}
				timedOut := 0
				for _, r := range results[i] {
					timedOut += r.timedOut
				}
				fmt.Printf("| %d | %d | %s | %.0f | %s | %s | %s | %s | %s | %.1f%% | %d | %s |\n", callers, descs, tg.name, med[i].rate,
					med[i].p50.Round(time.Microsecond), med[i].p99.Round(time.Microsecond), med[i].cpu.Round(100*time.Nanosecond),
					med[i].redisCPU.Round(100*time.Nanosecond), med[i].genCPU.Round(100*time.Nanosecond), 100*med[i].over, timedOut, ratio)
			}
		}
	}
}

// stops holds what this program started (see procs.Stops): main stops
// it at its end, OnSignal on SIGINT or SIGTERM, and fail on a failure,
// from any goroutine (log.Fatal would leave the processes running).
var stops procs.Stops

// fail stops what the program started and exits with err.
func fail(err error) { stops.Fatal(err) }

// check fails on a non-nil err.
func check(err error) {
	if err != nil {
		fail(err)
	}
}

// freePort is procs.FreePort for this program's stops.
func freePort() int { return procs.FreePort(&stops) }

// startFloodgate builds floodgate and runs floodgate serve --grpc on
// redisAddr with the domain file and the flags more, adds its stop to
// stops as soon as it starts, waits until it answers, and returns its
// address and process ID.
func startFloodgate(dir, redisAddr string, more ...string) (string, int) {
	bin := filepath.Join(dir, "floodgate")
	// The build's processes (go, and the compiler and linker it runs) are
	// a group of their own, which a signal stops: left running, the
	// linker wrote the binary into dir after the stops had removed it.
	build := exec.Command("go", "build", "-o", bin, "./cmd/floodgate")
	build.Dir = ".."
	build.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	var out bytes.Buffer
	build.Stdout, build.Stderr = &out, &out
	check(build.Start())
	built := make(chan struct{})
	stops.Add(func() {
		select {
		case <-built:
		default:
			syscall.Kill(-build.Process.Pid, syscall.SIGKILL)
		}
	})
	err := build.Wait()
	close(built)
	if err != nil {
		fail(fmt.Errorf("building floodgate: %v\n%s", err, out.Bytes()))
	}
	cfg := filepath.Join(dir, "floodgate-config")
	check(os.MkdirAll(cfg, 0o755))
	check(os.WriteFile(filepath.Join(cfg, "bench.yaml"), []byte(domain), 0o644))
	addr := "127.0.0.1:" + strconv.Itoa(freePort())
	args := append([]string{"serve", "--config", cfg, "--grpc", addr, "--http", "", "--resp", "", "--ui=false",
		"--redis", "redis://" + redisAddr, "--watch", "0"}, more...)
	cmd := exec.Command(bin, args...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Stderr = os.Stderr
	check(cmd.Start())
	stops.Add(func() { syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL); cmd.Wait() })
	for i := 0; ; i++ {
		if r := runGRPC(addr, 1, 1, 10*time.Millisecond); r.rate > 0 {
			break
		}
		if i == 100 {
			fail(errors.New("floodgate serve did not answer within 5s"))
		}
		time.Sleep(50 * time.Millisecond)
	}
	return addr, cmd.Process.Pid
}

type result struct {
	n             int     // requests answered
	rate          float64 // requests per second
	p50, p99      time.Duration
	cpu, redisCPU time.Duration // per request
	genCPU        time.Duration // this program's, per request
	over          float64       // fraction of answers over the limit
	timedOut      int           // calls past envoyTimeout
}

// envoyTimeout is the deadline of every call, as Envoy sends it: its rate
// limit filter's timeout (20ms by default) goes out as grpc-timeout, and
// each service's gRPC server then bounds the call with it. A call that
// runs out is counted (Envoy would let its request through, by default),
// not failed.
const envoyTimeout = 20 * time.Millisecond

// generators are the load generators, by their -client names: each sends
// requests of descs descriptors from callers concurrent callers to the
// service at addr for d, and tallies what came back.
var generators = map[string]func(addr string, callers, descs int, d time.Duration) result{"envoy": runH2, "grpc": runGRPC}

// runGRPC sends requests of descs descriptors from callers goroutines to
// the service at addr for d through a gRPC-Go client, each caller one
// request at a time.
func runGRPC(addr string, callers, descs int, d time.Duration) result {
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	check(err)
	defer conn.Close()
	c := rls.NewRateLimitServiceClient(conn)
	var mu sync.Mutex
	var lat []time.Duration
	var over, errs, timedOut int
	deadline := time.Now().Add(d)
	start := time.Now()
	var wg sync.WaitGroup
	for w := range callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(w), uint64(time.Now().UnixNano())))
			var mine []time.Duration
			myOver, myErrs, myTimedOut := 0, 0, 0
			for time.Now().Before(deadline) {
				req := requests[descs][rng.IntN(clients)]
				t0 := time.Now()
				ctx, cancel := context.WithTimeout(context.Background(), envoyTimeout)
				resp, err := c.ShouldRateLimit(ctx, req)
				cancel()
				mine = append(mine, time.Since(t0))
				switch {
				case status.Code(err) == codes.DeadlineExceeded:
					myTimedOut++
				case err != nil:
					myErrs++
				case resp.OverallCode == rls.RateLimitResponse_OVER_LIMIT:
					myOver++
				}
			}
			mu.Lock()
			lat = append(lat, mine...)
			over += myOver
			errs += myErrs
			timedOut += myTimedOut
			mu.Unlock()
		}()
	}
	wg.Wait()
	return tally(lat, time.Since(start), over, errs, timedOut)
}

// tally is a run's result from what its callers saw: every call's
// latency, over how long, and how many answers were over the limit,
// failed, or came past the deadline. A run with a failed call has none.
func tally(lat []time.Duration, elapsed time.Duration, over, errs, timedOut int) result {
	if errs > 0 || len(lat) == 0 {
		return result{}
	}
	slices.Sort(lat)
	return result{
		n:    len(lat),
		rate: float64(len(lat)) / elapsed.Seconds(),
		p50:  lat[len(lat)/2], p99: lat[len(lat)*99/100],
		over:     float64(over) / float64(len(lat)),
		timedOut: timedOut,
	}
}

// clients is how many client addresses the load comes from.
const clients = 10000

// requests holds every client's request, by number of descriptors (1 or
// 3), built once: the load generator shares the machine's cores with the
// service it measures, so what it spends building messages would be taken
// from both services alike. Calls only read them (gRPC marshals a message
// without changing it), so every caller shares them.
var requests = [4][]*rls.RateLimitRequest{1: buildRequests(1), 3: buildRequests(3)}

// buildRequests returns the clients' requests of descs descriptors: each
// one's address, and with three descriptors its user and the shared path.
func buildRequests(descs int) []*rls.RateLimitRequest {
	entry := func(k, v string) *rlcommon.RateLimitDescriptor {
		return &rlcommon.RateLimitDescriptor{Entries: []*rlcommon.RateLimitDescriptor_Entry{{Key: k, Value: v}}}
	}
	reqs := make([]*rls.RateLimitRequest, clients)
	for client := range reqs {
		req := &rls.RateLimitRequest{Domain: "bench", Descriptors: []*rlcommon.RateLimitDescriptor{entry("remote_address", "10.1."+strconv.Itoa(client/256)+"."+strconv.Itoa(client%256))}}
		if descs == 3 {
			req.Descriptors = append(req.Descriptors, entry("user", "u"+strconv.Itoa(client%1000)), entry("path", "/api"))
		}
		reqs[client] = req
	}
	return reqs
}

func median(rs []result) result {
	pick := func(f func(result) float64) float64 {
		v := make([]float64, len(rs))
		for i, r := range rs {
			v[i] = f(r)
		}
		sort.Float64s(v)
		return v[len(v)/2]
	}
	return result{
		rate:     pick(func(r result) float64 { return r.rate }),
		p50:      time.Duration(pick(func(r result) float64 { return float64(r.p50) })),
		p99:      time.Duration(pick(func(r result) float64 { return float64(r.p99) })),
		over:     pick(func(r result) float64 { return r.over }),
		cpu:      time.Duration(pick(func(r result) float64 { return float64(r.cpu) })),
		redisCPU: time.Duration(pick(func(r result) float64 { return float64(r.redisCPU) })),
		genCPU:   time.Duration(pick(func(r result) float64 { return float64(r.genCPU) })),
	}
}
