// Command redisbench measures floodgate side by side with its peers under
// the same load and prints one table:
//
//   - on Redis, against one redis-server that it starts itself:
//     floodgate's Redis store (batching on, denial cache on),
//     go-redis/redis_rate/v10 and go-zero's core/limit TokenLimiter;
//   - in process: floodgate's memory store and golang.org/x/time/rate.
//
// Rows: 1, 8 and 64 goroutines on one hot key and on 10,000 keys, and an
// abuse mix where 90% of requests hit 16 keys far over their limit.
// Within each run the peers take turns on the same load, each run starting
// with the next peer; at one goroutine they take turns request by request.
// The table shows the median of each column over the runs, so that a
// noisy machine affects all alike, and, where the peers ran one at a
// time, the Redis server's CPU time per decision.
//
//	cd bench && go run ./cmd/redisbench -duration 5s -runs 5
package main

import (
	"context"
	"flag"
	"fmt"
	"log"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"runtime"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/floodgate/floodgate"
	"github.com/floodgate/floodgate/bench/internal/flags"
	"github.com/floodgate/floodgate/bench/internal/procs"
	"github.com/floodgate/floodgate/redisstore"
	"github.com/floodgate/floodgate/storetest"
	"github.com/go-redis/redis_rate/v10"
	"github.com/redis/go-redis/v9"
	"github.com/zeromicro/go-zero/core/limit"
	"github.com/zeromicro/go-zero/core/logx"
	zredis "github.com/zeromicro/go-zero/core/stores/redis"
	"golang.org/x/time/rate"
)

// decider decides one request on key; it returns whether it was admitted.
type decider func(ctx context.Context, key string) (bool, error)

// peer is a rate limiter under test, built for a limit of rate per period
// with bursts of burst.
type peer struct {
	name  string
	make  func(rate int, period time.Duration, burst int) decider
	redis bool
}

// scenario is a row of the table.
type scenario struct {
	name        string
	goroutines  int
	keys        int // keys the requests spread over
	hot         int // with abuse: keys that take 90% of the requests
	rate, burst int
	inProcess   bool
	// record: the limit denies, so each request's time is recorded and
	// replayed through an exact limiter; otherwise an exact limiter
	// admits every request.
	record bool
}

type result struct {
	perSec      float64
	decisions   int64
	elapsed     time.Duration // the load's own time, by run
	p50, p99    time.Duration
	redisCPU    time.Duration // per decision
	clientCPU   time.Duration // this program's, per decision
	interleaved bool          // redisCPU was not measured
	admitted    int64
	exact       int64 // what an exact limiter admits on the same arrivals
	// exactLo and exactHi: the same, with each request at the start and
	// at the end of its call, between which it was decided; 0 when the
	// run was not recorded.
	exactLo, exactHi int64
	ideal            int64
	latMeasured      bool
}

func main() {
	duration := flag.Duration("duration", 5*time.Second, "length of each run of each cell")
	runs := flag.Int("runs", 5, "runs of each cell; the table shows medians")
	port := flag.Int("port", 0, "loopback port for the redis-server this program starts (0: a free one)")
	memKeys := flag.Int("memory-keys", 100000, "keys to fill for the bytes-per-key column; 0 to skip")
	only := flag.String("only", "", "run only the loads whose name contains this")
	cpuprofile := flag.String("cpuprofile", "", "write a CPU profile of the whole run to this file")
	inflight := flag.Int("inflight", 0, "floodgate's MaxInflight (0: its default)")
	goroutines := flag.String("goroutines", "1,8,64", "the concurrency levels of the Redis loads on one key and on 10,000 keys, comma-separated")
	cluster := flag.Bool("cluster", false, "only measure a standalone server and Redis Clusters of 1, 3 and 6 masters, side by side, at 64 goroutines on 10,000 keys")
	masters := flag.String("masters", "1,3,6", "with -cluster: the Clusters' numbers of masters, comma-separated")
	flag.Parse()
	// Before anything starts: log.Fatal would leave a redis-server running.
	levels := flags.Counts("-goroutines", *goroutines)
	masterCounts := flags.Counts("-masters", *masters)
	if *cpuprofile != "" {
		f, err := os.Create(*cpuprofile)
		if err != nil {
			log.Fatal(err)
		}
		pprof.StartCPUProfile(f)
		defer pprof.StopCPUProfile()
	}
	logx.Disable()
	stolen := procs.ReadStolen()
	defer func() { fmt.Printf("\n%s\n", stolen.Note()) }()
	// The servers this program starts are stopped at the end of main, on
	// SIGINT or SIGTERM, and on a failure (see stops).
	defer stops.Run()
	stops.OnSignal()

	if *cluster {
		clusterScaling(*duration, *runs, masterCounts)
		return
	}
	if *slotsFlag && *slotsCallgrind > 0 { // instructions per pair (slotsir.go)
		slotsIrBench(levels, *slotsCallgrind)
		return
	}
	addr := procs.StartRedis(&stops, *port)
	if *slotsFlag { // concurrency limits (slots.go)
		slotsBench(addr, *duration, *runs, levels)
		return
	}
	client := redis.NewClient(&redis.Options{Addr: addr, PoolSize: 128})
	defer client.Close()
	ctx := context.Background()
	serverClock = func() time.Time {
		t, err := client.Time(ctx).Result()
		if err != nil {
			stops.Fatal(err)
		}
		return t
	}
	zstore := zredis.MustNewRedis(zredis.RedisConf{Host: addr, Type: zredis.NodeType})

	fg := redisstore.New(client, &redisstore.Options{Prefix: "fg:", DenialCache: true, MaxInflight: *inflight})
	defer fg.Close()
	// The same with leases on hot keys. leased and leasedCalls count its
	// decisions and its script calls in the runs, the one from the runs'
	// results and the other from its Stats before and after each: a
	// counter in the decider would be written by every goroutine on every
	// decision, a cost of the harness that only this peer would bear.
	fgl := redisstore.New(client, &redisstore.Options{Prefix: "fgl:", DenialCache: true, MaxInflight: *inflight, Leases: &redisstore.LeaseOptions{}})
	defer fgl.Close()
	var leased, leasedCalls uint64
	const leasesPeer = "floodgate + leases"
	// track runs f, which returns the results of peers in order, and adds
	// the lease peer's share to leased and leasedCalls.
	track := func(peers []peer, f func() []result) []result {
		calls0 := fgl.Stats().ScriptCalls
		rs := f()
		for i, p := range peers {
			if p.name == leasesPeer {
				leased += uint64(rs[i].decisions)
				leasedCalls += fgl.Stats().ScriptCalls - calls0
			}
		}
		return rs
	}
	redisPeers := []peer{
		{"floodgate", func(r int, p time.Duration, b int) decider {
			lim, err := floodgate.NewLimiter(fg, []floodgate.Limit{floodgate.TokenBucket(int64(r), p, int64(b))}, nil)
			if err != nil {
				panic(err)
			}
			return func(ctx context.Context, key string) (bool, error) {
				res, err := lim.Allow(ctx, key)
				return res.Allowed, err
			}
		}, true},
		{"redis_rate", func(r int, p time.Duration, b int) decider {
			rr := redis_rate.NewLimiter(client)
			l := redis_rate.Limit{Rate: r, Period: p, Burst: b}
			return func(ctx context.Context, key string) (bool, error) {
				res, err := rr.Allow(ctx, key, l)
				return err == nil && res.Allowed > 0, err
			}
		}, true},
		{leasesPeer, func(r int, p time.Duration, b int) decider {
			lim, err := floodgate.NewLimiter(fgl, []floodgate.Limit{floodgate.TokenBucket(int64(r), p, int64(b))}, nil)
			if err != nil {
				panic(err)
			}
			return func(ctx context.Context, key string) (bool, error) {
				res, err := lim.Allow(ctx, key)
				return res.Allowed, err
			}
		}, true},
		{"go-zero", func(r int, p time.Duration, b int) decider {
			r = max(1, int(int64(r)*int64(time.Second)/int64(p))) // it takes a rate per second
			var lims sync.Map
			return func(ctx context.Context, key string) (bool, error) {
				l, ok := lims.Load(key)
				if !ok {
					l, _ = lims.LoadOrStore(key, limit.NewTokenLimiter(r, b, zstore, "gz:"+key))
				}
				return l.(*limit.TokenLimiter).AllowCtx(ctx), nil
			}
		}, true},
	}
	memPeers := []peer{
		{"floodgate memory", func(r int, _ time.Duration, b int) decider {
			lim, _ := floodgate.New(floodgate.TokenBucket(int64(r), time.Second, int64(b)))
			return func(ctx context.Context, key string) (bool, error) {
				res, err := lim.Allow(ctx, key)
				return res.Allowed, err
			}
		}, false},
		{"x/time/rate", func(r int, _ time.Duration, b int) decider {
			var lims sync.Map // one Limiter per key, as users keep them
			return func(ctx context.Context, key string) (bool, error) {
				l, ok := lims.Load(key)
				if !ok {
					l, _ = lims.LoadOrStore(key, rate.NewLimiter(rate.Limit(r), b))
				}
				return l.(*rate.Limiter).Allow(), nil
			}
		}, false},
	}

	// A limit that admits everything: 1,000,000 a second with a burst that
	// no run can use up. With a burst of one second's rate, leases on one
	// hot key used it up within a run, and then made as many decisions as
	// the limit refilled (about 1.33M/s over 3s, in every run): the cell
	// measured the limit, not the lease.
	const open, openBurst = 1_000_000, 1_000_000_000
	var scenarios []scenario
	for _, g := range levels {
		for _, k := range []int{1, 10000} {
			scenarios = append(scenarios, scenario{fmt.Sprintf("%d goroutines, %d key(s)", g, k), g, k, 0, open, openBurst, false, false})
		}
	}
	scenarios = append(scenarios, scenario{"abuse: 64 goroutines, 90% on 16 keys over 10/s", 64, 10000, 16, 10, 10, false, true})
	// One hot key asked for more than its limit: what leases admit against
	// an exact limiter on the same arrivals.
	scenarios = append(scenarios, scenario{"over the limit: 64 goroutines, 1 key at 20000/s", 64, 1, 0, 20000, 20000, false, true})
	for _, g := range []int{1, 8, 64} {
		for _, k := range []int{1, 10000} {
			scenarios = append(scenarios, scenario{fmt.Sprintf("in process: %d goroutines, %d key(s)", g, k), g, k, 0, 1_000_000_000, 1_000_000_000, true, false})
		}
	}

	cpu := "?"
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for _, line := range strings.Split(string(b), "\n") {
			if v, ok := strings.CutPrefix(line, "model name"); ok {
				cpu = strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(v), ":"))
				break
			}
		}
	}
	fmt.Printf("%s, %d CPUs (GOMAXPROCS %d), %s, redis-server %s on loopback; %d runs of %s per cell, medians\n\n",
		cpu, runtime.NumCPU(), runtime.GOMAXPROCS(0), runtime.Version(), redisVersion(client), *runs, *duration)
	// Warm every peer up first (connections, scripts loaded, code paths),
	// so that the first cell does not pay for it.
	for _, p := range append(slices.Clone(redisPeers), memPeers...) {
		run(p.make(open, time.Second, openBurst), scenario{goroutines: 4, keys: 100, rate: open, burst: openBurst, inProcess: !p.redis}, time.Second)
	}
	client.FlushAll(ctx)
	ceiling := scriptCeiling(ctx, client, addr)
	var fgAt64 []string // floodgate's 64-goroutine rows against the ceiling
	fmt.Println("| load | limiter | decisions/s | p50 | p99 | Redis CPU per decision | client CPU per decision | ratio | admitted / exact | exact at call starts … ends | admitted / ideal |")
	fmt.Println("|---|---|---|---|---|---|---|---|---|---|---|")
	for _, sc := range scenarios {
		if !strings.Contains(sc.name, *only) {
			continue
		}
		peers := redisPeers
		if sc.inProcess {
			peers = memPeers
		}
		res := make([][]result, len(peers))
		if sc.inProcess || sc.goroutines == 1 {
			// The peers take turns within each run, so that the
			// machine's drift (this is a shared VM) hits all alike: one
			// caller over Redis request by request (runInterleaved), in
			// process in tenths of the run (runSliced). Each run is still
			// a separate sample.
			for r := range *runs {
				if !sc.inProcess {
					client.FlushAll(ctx)
				}
				ds := make([]decider, len(peers))
				for i, p := range peers {
					ds[i] = p.make(sc.rate, time.Second, sc.burst)
				}
				var rs []result
				if sc.inProcess {
					rs = runSliced(ds, sc, *duration, r)
				} else {
					rs = track(peers, func() []result { return runInterleaved(ds, sc, *duration) })
				}
				for i := range rs {
					res[i] = append(res[i], rs[i])
				}
			}
		} else {
			for r := range *runs {
				// Each run starts with the next peer, so that none always
				// runs first (or last) after a flush.
				for j := range peers {
					i := (r + j) % len(peers)
					p := peers[i]
					// Only the Redis peers run here: the in-process ones took turns above.
					client.FlushAll(ctx)
					cpu0 := redisCPU(ctx, client)
					d := p.make(sc.rate, time.Second, sc.burst)
					own0 := procs.CPU(&stops, os.Getpid()) // the limiter's client side, with the load's own work
					rs := track(peers[i:i+1], func() []result { return []result{run(d, sc, *duration)} })[0]
					rs.clientCPU = (procs.CPU(&stops, os.Getpid()) - own0) / time.Duration(max(rs.decisions, 1))
					rs.redisCPU = (redisCPU(ctx, client) - cpu0) / time.Duration(max(rs.decisions, 1))
					res[i] = append(res[i], rs)
				}
			}
		}
		base := median(res[1]).perSec // redis_rate, or x/time/rate
		if !sc.inProcess && sc.goroutines == 64 && sc.hot == 0 && ceiling > 0 {
			fgAt64 = append(fgAt64, fmt.Sprintf("%s: %.0f decisions/s, %.0f%% of it", sc.name, median(res[0]).perSec, 100*median(res[0]).perSec/ceiling))
		}
		for i, p := range peers {
			m := median(res[i])
			p50, p99, cpu, own := "-", "-", "-", "-"
			if m.latMeasured {
				p50, p99 = fmtDur(m.p50), fmtDur(m.p99)
				if !m.interleaved {
					cpu = fmt.Sprintf("%.1fµs", float64(m.redisCPU)/float64(time.Microsecond))
				}
			}
			if !m.interleaved {
				own = fmt.Sprintf("%.2fµs", float64(m.clientCPU)/float64(time.Microsecond))
			}
			band := "-"
			if m.exactHi > 0 {
				lo, hi := min(m.exactLo, m.exactHi), max(m.exactLo, m.exactHi)
				within := "within"
				if m.admitted < lo || m.admitted > hi {
					within = "OUTSIDE"
				}
				band = fmt.Sprintf("%d … %d (%s)", m.exactLo, m.exactHi, within)
			}
			fmt.Printf("| %s | %s | %.0f | %s | %s | %s | %s | %.2f× | %d / %d (%.1f%%) | %s | %.1f%% |\n", sc.name, p.name, m.perSec, p50, p99, cpu, own,
				m.perSec/base, m.admitted, m.exact, 100*float64(m.admitted)/float64(m.exact), band, 100*float64(m.admitted)/float64(m.ideal))
		}
	}
	if ceiling > 0 && len(fgAt64) > 0 {
		fmt.Printf("\nThe ceiling: redis-benchmark, 64 connections, pipelines of 32 EVALSHA of a script that returns 1: %.0f script calls/s. floodgate at %s.\n",
			ceiling, strings.Join(fgAt64, "; "))
	}
	if *memKeys > 0 {
		fmt.Println()
		memoryPerKey(ctx, client, redisPeers, *memKeys)
	}
	s := fg.Stats()
	fmt.Printf("\nfloodgate sent %d decisions in %d script calls (%.1f per call)\n", s.Decisions, s.ScriptCalls, float64(s.Decisions)/float64(max(s.ScriptCalls, 1)))
	fmt.Printf("floodgate + leases decided %d requests with %d script calls in the runs (%.4f calls per decision)\n", leased, leasedCalls, float64(leasedCalls)/float64(max(leased, 1)))
}

func fmtDur(d time.Duration) string {
	if d < time.Millisecond {
		return fmt.Sprintf("%dµs", d.Microseconds())
	}
	return fmt.Sprintf("%.2fms", float64(d)/float64(time.Millisecond))
}

// runInterleaved drives ds with sc's load from one goroutine for dur,
// the deciders in turn, one request at a time, each first in turn as often
// as the others, and measures each. A
// decider's decisions/s is the inverse of its mean latency. Redis CPU is
// not told apart, so it is not reported.
func runInterleaved(ds []decider, sc scenario, dur time.Duration) []result {
	names := make([]string, sc.keys)
	for i := range names {
		names[i] = "k" + strconv.Itoa(i)
	}
	ctx := context.Background()
	lat := make([][]time.Duration, len(ds))
	busy := make([]time.Duration, len(ds))
	admitted := make([]int64, len(ds))
	perKey := make([][]int64, len(ds)) // requests per key, the same for all
	for i := range ds {
		perKey[i] = make([]int64, sc.keys)
	}
	start := time.Now()
	for n := 0; n%64 != 0 || time.Since(start) < dur; n++ {
		k := n % sc.keys
		for j := range ds {
			i := (n + j) % len(ds) // each takes each place in the turn
			d := ds[i]
			t0 := time.Now()
			ok, err := d(ctx, names[k])
			l := time.Since(t0)
			if err != nil {
				stops.Fatal(err)
			}
			lat[i] = append(lat[i], l)
			busy[i] += l
			perKey[i][k]++
			if ok {
				admitted[i]++
			}
		}
	}
	elapsed := time.Since(start)
	most := int64(sc.burst) + int64(float64(sc.rate)*elapsed.Seconds())
	out := make([]result, len(ds))
	for i := range ds {
		var ideal int64
		for _, c := range perKey[i] {
			ideal += min(c, most)
		}
		all := lat[i]
		slices.Sort(all)
		// The limit admits everything (sc.record is not supported here):
		// so does an exact limiter.
		out[i] = result{perSec: float64(len(all)) / busy[i].Seconds(), decisions: int64(len(all)),
			p50: all[len(all)/2], p99: all[len(all)*99/100], latMeasured: true, admitted: admitted[i], exact: int64(len(all)), ideal: ideal, interleaved: true}
	}
	return out
}

// inProcessSlices is how many turns each in-process peer takes in a run.
// A decision there takes a tenth of a microsecond and no peer waits for
// anything, so a run measures the CPU that the machine gives the process;
// on a shared VM that drops for seconds at a time, and runs of 3s one
// peer after the other let such a stall fall on one peer's runs. Slices
// of a tenth of the run spread it over both.
const inProcessSlices = 10

// runSliced runs ds, in-process peers, on sc for dur each, in
// inProcessSlices turns of dur/inProcessSlices (round s of run r starts
// with peer r+s, modulo their number), and adds up each peer's turns:
// decisions over the time they took, and the process's CPU time over its
// decisions. Each peer's state carries over from one turn to the next.
func runSliced(ds []decider, sc scenario, dur time.Duration, run0 int) []result {
	out := make([]result, len(ds))
	busy := make([]time.Duration, len(ds))
	cpu := make([]time.Duration, len(ds))
	slice := dur / inProcessSlices
	for s := range inProcessSlices {
		for j := range ds {
			i := (run0 + s + j) % len(ds)
			own0 := procs.CPU(&stops, os.Getpid())
			r := run(ds[i], sc, slice)
			cpu[i] += procs.CPU(&stops, os.Getpid()) - own0
			busy[i] += r.elapsed // the load's, not the setting up and adding up around it
			o := &out[i]
			o.decisions += r.decisions
			o.admitted += r.admitted
			o.exact += r.exact
			o.ideal += r.ideal
		}
	}
	for i := range out {
		out[i].perSec = float64(out[i].decisions) / busy[i].Seconds()
		out[i].clientCPU = cpu[i] / time.Duration(max(out[i].decisions, 1))
	}
	return out
}

// run drives d with sc's load for dur and measures it. In process, where
// a decision takes about as long as reading the clock, latency is not
// measured.
func run(d decider, sc scenario, dur time.Duration) result {
	var serverStart time.Time
	if sc.record && !sc.inProcess && serverClock != nil {
		serverStart = serverClock()
	}
	names := make([]string, sc.keys)
	for i := range names {
		names[i] = "k" + strconv.Itoa(i)
	}
	// Each goroutine counts its decisions, and its requests and admissions
	// per key, in variables of its own, and hands them over when it ends:
	// counters side by side in one slice would make the goroutines write
	// the same cache lines on every decision. That cost is the harness's,
	// it weighs on every peer alike, and at 8 goroutines it hid the
	// difference between them.
	requests := make([][]int64, sc.goroutines)
	admitted := make([][]int64, sc.goroutines)
	ctx := context.Background()
	lat := make([][]time.Duration, sc.goroutines)
	counts := make([]int64, sc.goroutines)
	arrivals := make([][]arrival, sc.goroutines)
	var wg sync.WaitGroup
	var stop atomic.Bool
	start := time.Now()
	for g := range sc.goroutines {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(g), 1))
			reqs, adms := make([]int64, sc.keys), make([]int64, sc.keys)
			var n int64
			var myLat []time.Duration
			var myArr []arrival
			defer func() {
				requests[g], admitted[g], counts[g] = reqs, adms, n
				lat[g], arrivals[g] = myLat, myArr
			}()
			i := g
			for ; ; n++ {
				if n%64 == 0 && (stop.Load() || time.Since(start) > dur) {
					stop.Store(true)
					return
				}
				k := i % sc.keys
				if sc.hot > 0 {
					if rng.IntN(10) < 9 {
						k = rng.IntN(sc.hot)
					} else {
						k = sc.hot + rng.IntN(sc.keys-sc.hot)
					}
				}
				var t0 time.Time
				if !sc.inProcess {
					t0 = time.Now()
				}
				ok, err := d(ctx, names[k])
				if err != nil {
					stops.Fatal(err)
				}
				if !sc.inProcess {
					l := time.Since(t0)
					myLat = append(myLat, l)
					if sc.record {
						// The decision was made between t0 and t0+l;
						// the middle is the best guess of when.
						myArr = append(myArr, arrival{at: t0.Add(l / 2), from: t0, to: t0.Add(l), key: int32(k), ok: ok})
					}
				}
				reqs[k]++
				if ok {
					adms[k]++
				}
				i += sc.goroutines
			}
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	if !serverStart.IsZero() {
		onServerClock(arrivals, start, elapsed, serverStart, serverClock())
	}
	var total, adm, ideal int64
	for g := range counts {
		total += counts[g]
	}
	most := int64(sc.burst) + int64(float64(sc.rate)*elapsed.Seconds())
	for k := range sc.keys {
		var req int64
		for g := range sc.goroutines {
			req += requests[g][k]
			adm += admitted[g][k]
		}
		ideal += min(req, most)
	}
	exact := total // the limit admits everything, and so would an exact limiter
	var exactLo, exactHi int64
	if sc.record {
		exact = exactAdmissions(arrivals, sc, func(a arrival) time.Time { return a.at })
		if !sc.inProcess {
			exactLo = exactAdmissions(arrivals, sc, func(a arrival) time.Time { return a.from })
			exactHi = exactAdmissions(arrivals, sc, func(a arrival) time.Time { return a.to })
		}
	}
	r := result{perSec: float64(total) / elapsed.Seconds(), decisions: total, elapsed: elapsed, admitted: adm, exact: exact, exactLo: exactLo, exactHi: exactHi, ideal: ideal}
	if !sc.inProcess {
		all := slices.Concat(lat...)
		slices.Sort(all)
		r.p50, r.p99, r.latMeasured = all[len(all)/2], all[len(all)*99/100], true
	}
	return r
}

// median returns the median of each column of rs over the runs, each taken
// on its own: the run with the median throughput need not have the median
// latency.
func median(rs []result) result {
	m := rs[0]
	m.perSec = medianOf(rs, func(r result) float64 { return r.perSec })
	m.p50 = time.Duration(medianOf(rs, func(r result) float64 { return float64(r.p50) }))
	m.p99 = time.Duration(medianOf(rs, func(r result) float64 { return float64(r.p99) }))
	m.redisCPU = time.Duration(medianOf(rs, func(r result) float64 { return float64(r.redisCPU) }))
	m.clientCPU = time.Duration(medianOf(rs, func(r result) float64 { return float64(r.clientCPU) }))
	// Admitted, exact and ideal stay together, from the median-throughput run.
	i := slices.IndexFunc(rs, func(r result) bool { return r.perSec == m.perSec })
	m.admitted, m.exact, m.ideal = rs[i].admitted, rs[i].exact, rs[i].ideal
	m.exactLo, m.exactHi = rs[i].exactLo, rs[i].exactHi
	return m
}

func medianOf(rs []result, f func(result) float64) float64 {
	v := make([]float64, len(rs))
	for i, r := range rs {
		v[i] = f(r)
	}
	slices.Sort(v)
	return v[len(v)/2]
}

// redisCPU returns the CPU time the redis-server process has used so far,
// user and system, as INFO cpu reports it.
func redisCPU(ctx context.Context, c *redis.Client) time.Duration {
	info, _ := c.Info(ctx, "cpu").Result()
	var total float64
	for _, line := range strings.Split(info, "\r\n") {
		for _, f := range []string{"used_cpu_sys:", "used_cpu_user:"} {
			if v, ok := strings.CutPrefix(line, f); ok {
				x, _ := strconv.ParseFloat(v, 64)
				total += x
			}
		}
	}
	return time.Duration(total * float64(time.Second))
}

// memoryPerKey fills n keys with one decision each, for each Redis peer,
// and reports the growth of used_memory per key.
func memoryPerKey(ctx context.Context, client *redis.Client, peers []peer, n int) {
	fmt.Printf("| limiter (token bucket, one request per key) | Redis keys per limited key | Redis bytes per limited key (%d keys) |\n|---|---|---|\n", n)
	// The first fill is thrown away: used_memory settles after a flush of
	// many keys only once the allocator has been through one fill.
	for i, p := range append([]peer{peers[0]}, peers...) {
		client.FlushAll(ctx)
		before := usedMemory(ctx, client)
		d := p.make(1, time.Hour, 100) // keys outlive the fill
		var wg sync.WaitGroup
		for g := range 16 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for k := g; k < n; k += 16 {
					if _, err := d(ctx, "user:"+strconv.Itoa(k)); err != nil {
						stops.Fatal(err)
					}
				}
			}()
		}
		wg.Wait()
		if i == 0 {
			continue
		}
		keys, _ := client.DBSize(ctx).Result()
		fmt.Printf("| %s | %.0f | %.0f |\n", p.name, float64(keys)/float64(n), float64(usedMemory(ctx, client)-before)/float64(n))
	}
}

func usedMemory(ctx context.Context, c *redis.Client) int64 {
	info, _ := c.Info(ctx, "memory").Result()
	for _, line := range strings.Split(info, "\r\n") {
		if v, ok := strings.CutPrefix(line, "used_memory:"); ok {
			n, _ := strconv.ParseInt(v, 10, 64)
			return n
		}
	}
	return 0
}

func redisVersion(c *redis.Client) string {
	info, _ := c.Info(context.Background(), "server").Result()
	for _, line := range strings.Split(info, "\r\n") {
		if v, ok := strings.CutPrefix(line, "redis_version:"); ok {
			return v
		}
	}
	return "?"
}

// stops holds the servers this program started (see procs.Stops), for
// main to stop at its end, on a signal, and on a failure: every failure
// once a server runs, in any goroutine, exits through stops.Fatal, where
// log.Fatal would leave the servers running and their folders behind.
var stops procs.Stops

// serverClock reads Redis's TIME, the clock the Redis limiters decide
// on; set by main.
var serverClock func() time.Time

// onServerClock moves a run's recorded times, read on this process's
// monotonic clock from start over elapsed, onto Redis's clock, read at
// the run's start and end. The two disagree on this VM by up to a
// millisecond a second (its wall clock is disciplined, in steps or
// slews, and Redis reads the wall clock): an exact replay on the local
// clock then credits a hot key with refills that Redis never saw.
func onServerClock(arrivals [][]arrival, start time.Time, elapsed time.Duration, s0, s1 time.Time) {
	scale := float64(s1.Sub(s0)) / float64(elapsed)
	move := func(t time.Time) time.Time { return s0.Add(time.Duration(float64(t.Sub(start)) * scale)) }
	for g := range arrivals {
		for i := range arrivals[g] {
			a := &arrivals[g][i]
			a.at, a.from, a.to = move(a.at), move(a.from), move(a.to)
		}
	}
}

// arrival is one request of a recorded run: when it was decided (the
// middle of its call, our best guess; from and to are the call's start
// and end, between which it was), on which key, and whether it was
// admitted.
type arrival struct {
	at, from, to time.Time
	key          int32
	ok           bool
}

// exactAdmissions replays a run's arrivals, key by key in time order,
// through an exact limiter with the scenario's limit (floodgate's pure
// token bucket on a fixed clock), and returns how many it admits: the
// reference that every peer's admissions are compared with, the same for
// all of them.
func exactAdmissions(arrivals [][]arrival, sc scenario, at func(arrival) time.Time) int64 {
	all := slices.Concat(arrivals...)
	if len(all) == 0 {
		return 0
	}
	slices.SortFunc(all, func(a, b arrival) int { return at(a).Compare(at(b)) })
	e, err := storetest.NewExact(at(all[0]), floodgate.TokenBucket(int64(sc.rate), time.Second, int64(sc.burst)))
	if err != nil {
		stops.Fatal(err)
	}
	defer e.Close()
	var n int64
	for _, a := range all {
		if e.Allow(strconv.Itoa(int(a.key)), at(a)) {
			n++
		}
	}
	return n
}

// scriptCeiling measures the most script calls a second that the
// redis-server at addr answers on this machine: redis-benchmark with 64
// connections sending pipelines of 32 EVALSHA of a script that only
// returns 1. It returns 0 when redis-benchmark is missing or fails.
func scriptCeiling(ctx context.Context, client *redis.Client, addr string) float64 {
	sha, err := client.ScriptLoad(ctx, "return 1").Result()
	if err != nil {
		stops.Fatal(err)
	}
	host, port, _ := net.SplitHostPort(addr)
	out, err := exec.Command("redis-benchmark", "-h", host, "-p", port, "-c", "64", "-P", "32", "-n", "3000000", "--csv", "EVALSHA", sha, "0").Output()
	if err != nil {
		log.Printf("redis-benchmark: %v; no ceiling", err)
		return 0
	}
	// The last line is "name","requests per second",...
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	f := strings.Split(lines[len(lines)-1], ",")
	if len(f) < 2 {
		return 0
	}
	rps, _ := strconv.ParseFloat(strings.Trim(f[1], `"`), 64)
	return rps
}

// clusterScaling measures floodgate and redis_rate on one standalone
// redis-server and on Redis Clusters of 1, 3 and 6 masters that it starts
// on this machine, in the same session, at 64 goroutines on 10,000 keys
// with a limit that admits everything. All the servers share the
// machine's cores, so the figures show the cost of routing, not scaling.
// Beside each floodgate row: its decisions per script call and the Redis
// CPU per decision (summed over the masters), each also as a share of
// the standalone server's.
func clusterScaling(dur time.Duration, runs int, masterCounts []int) {
	sc := scenario{name: "64 goroutines, 10000 keys", goroutines: 64, keys: 10000, rate: 1_000_000, burst: 1_000_000}
	fmt.Printf("Redis Cluster on loopback, %d CPUs; %d runs of %s per cell, medians; %s\n\n", runtime.NumCPU(), runs, dur, sc.name)
	fmt.Println("| masters | limiter | decisions/s | p50 | p99 | ratio | floodgate decisions per script call | of standalone's | Redis CPU per decision (all masters) | × standalone's | client CPU per decision | floodgate script calls per round trip |")
	fmt.Println("|---|---|---|---|---|---|---|---|---|---|---|---|")
	var basePer, baseCPU float64 // standalone floodgate's
	for _, masters := range append([]int{0}, masterCounts...) {
		var uc redis.UniversalClient
		var servers []*redis.Client // to read each one's CPU
		var stop func()
		name := strconv.Itoa(masters)
		if masters == 0 {
			name = "standalone"
			addr, stopOne := procs.StartRedis(&stops, 0), func() {}
			stop = stopOne
			c := redis.NewClient(&redis.Options{Addr: addr, PoolSize: 128})
			uc, servers = c, []*redis.Client{c}
		} else {
			var addrs []string
			addrs, stop = procs.StartCluster(&stops, masters)
			uc = redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs, PoolSize: 128})
			for _, a := range addrs {
				servers = append(servers, redis.NewClient(&redis.Options{Addr: a}))
			}
		}
		cpu := func() time.Duration {
			var t time.Duration
			for _, c := range servers {
				t += redisCPU(context.Background(), c)
			}
			return t
		}
		fg := redisstore.New(uc, &redisstore.Options{Prefix: "fg:", DenialCache: true})
		lim, err := floodgate.NewLimiter(fg, []floodgate.Limit{floodgate.TokenBucket(int64(sc.rate), time.Second, int64(sc.burst))}, nil)
		if err != nil {
			stops.Fatal(err)
		}
		rr := redis_rate.NewLimiter(uc)
		l := redis_rate.Limit{Rate: sc.rate, Period: time.Second, Burst: sc.burst}
		ds := []decider{
			func(ctx context.Context, key string) (bool, error) {
				res, err := lim.Allow(ctx, key)
				return res.Allowed, err
			},
			func(ctx context.Context, key string) (bool, error) {
				res, err := rr.Allow(ctx, key, l)
				return err == nil && res.Allowed > 0, err
			},
		}
		names := []string{"floodgate", "redis_rate"}
		run(ds[0], scenario{goroutines: 8, keys: 1000, rate: sc.rate, burst: sc.burst}, time.Second) // warm up
		run(ds[1], scenario{goroutines: 8, keys: 1000, rate: sc.rate, burst: sc.burst}, time.Second)
		res := make([][]result, len(ds))
		s0 := fg.Stats()
		for r := range runs {
			for j := range ds {
				i := (r + j) % len(ds)
				c0, own0 := cpu(), procs.CPU(&stops, os.Getpid())
				rs := run(ds[i], sc, dur)
				rs.redisCPU = (cpu() - c0) / time.Duration(max(rs.decisions, 1))
				rs.clientCPU = (procs.CPU(&stops, os.Getpid()) - own0) / time.Duration(max(rs.decisions, 1))
				res[i] = append(res[i], rs)
			}
		}
		s1 := fg.Stats()
		base := median(res[1]).perSec
		for i := range ds {
			m := median(res[i])
			per, ofPer, cpuOf, trip := "-", "-", "-", "-"
			perCall := float64(s1.Decisions-s0.Decisions) / float64(max(s1.ScriptCalls-s0.ScriptCalls, 1))
			if masters == 0 && i == 0 {
				basePer, baseCPU = perCall, float64(m.redisCPU)
			}
			if i == 0 {
				per = fmt.Sprintf("%.1f", perCall)
				ofPer = fmt.Sprintf("%.0f%%", 100*perCall/basePer)
				cpuOf = fmt.Sprintf("%.2f×", float64(m.redisCPU)/baseCPU)
				trip = fmt.Sprintf("%.1f", float64(s1.ScriptCalls-s0.ScriptCalls)/float64(max(s1.RoundTrips-s0.RoundTrips, 1)))
			}
			fmt.Printf("| %s | %s | %.0f | %s | %s | %.2f× | %s | %s | %.1fµs | %s | %.1fµs | %s |\n", name, names[i], m.perSec, fmtDur(m.p50), fmtDur(m.p99), m.perSec/base,
				per, ofPer, float64(m.redisCPU)/float64(time.Microsecond), cpuOf, float64(m.clientCPU)/float64(time.Microsecond), trip)
		}
		fg.Close()
		uc.Close()
		for _, c := range servers {
			c.Close()
		}
		stop()
	}
}
