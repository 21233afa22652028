// Command redisbench measures floodgate's Redis store side by side with
// go-redis/redis_rate/v10 on one redis-server that it starts itself, under
// the same load, and prints one table. Runs are interleaved (floodgate,
// redis_rate, floodgate, ...) and the table shows medians, so that a noisy
// machine affects both alike.
//
//	cd bench && go run ./cmd/redisbench -duration 3s -runs 3
package main

import (
	"context"
	"flag"
	"fmt"
	"log"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/floodgate/floodgate"
	"github.com/floodgate/floodgate/redisstore"
	"github.com/go-redis/redis_rate/v10"
	"github.com/redis/go-redis/v9"
)

type result struct {
	perSec   float64
	p50, p99 time.Duration
	admitted int64
}

type decider func(ctx context.Context, key string) (bool, error)

func main() {
	duration := flag.Duration("duration", 3*time.Second, "length of each run")
	runs := flag.Int("runs", 3, "runs of each cell; the table shows medians")
	port := flag.Int("port", 46379, "loopback port for the redis-server this program starts")
	flag.Parse()

	addr, stop := startRedis(*port)
	defer stop()
	client := redis.NewClient(&redis.Options{Addr: addr, PoolSize: 128})
	defer client.Close()
	ctx := context.Background()

	// Both limit 1e6/s with burst 1e6: every decision is admitted, so the
	// comparison measures the decision, not the denial path.
	fgStore := redisstore.New(client, &redisstore.Options{Prefix: "fg:"})
	fgLimits := []floodgate.Limit{floodgate.TokenBucket(1000000, time.Second, 1000000)}
	rr := redis_rate.NewLimiter(client)
	rrLimit := redis_rate.Limit{Rate: 1000000, Period: time.Second, Burst: 1000000}
	peers := []struct {
		name string
		d    decider
	}{
		{"floodgate", func(ctx context.Context, key string) (bool, error) {
			r, err := fgStore.Take(ctx, key, fgLimits, 1)
			return r.Allowed, err
		}},
		{"redis_rate", func(ctx context.Context, key string) (bool, error) {
			r, err := rr.Allow(ctx, key, rrLimit)
			return r != nil && r.Allowed > 0, err
		}},
	}

	fmt.Printf("redis-server %s on %s, %d runs of %s each, medians\n\n", redisVersion(client), addr, *runs, *duration)
	fmt.Printf("| goroutines | keys | store | decisions/s | p50 | p99 | ratio |\n|---|---|---|---|---|---|---|\n")
	for _, g := range []int{1, 64} {
		for _, keys := range []int{1, 10000} {
			res := make([][]result, len(peers))
			for r := 0; r < *runs; r++ {
				for i, p := range peers {
					client.FlushAll(ctx)
					res[i] = append(res[i], run(p.d, g, keys, *duration))
				}
			}
			base := median(res[1]).perSec
			for i, p := range peers {
				m := median(res[i])
				fmt.Printf("| %d | %d | %s | %.0f | %s | %s | %.2f× |\n", g, keys, p.name, m.perSec,
					m.p50.Round(time.Microsecond), m.p99.Round(time.Microsecond), m.perSec/base)
			}
		}
	}
	fmt.Println()
	memoryPerKey(ctx, client)
}

func run(d decider, goroutines, keys int, dur time.Duration) result {
	names := make([]string, keys)
	for i := range names {
		names[i] = "k" + strconv.Itoa(i)
	}
	ctx := context.Background()
	lat := make([][]time.Duration, goroutines)
	var wg sync.WaitGroup
	start := time.Now()
	stopAt := start.Add(dur)
	for g := 0; g < goroutines; g++ {
		wg.Add(1)
		go func(g int) {
			defer wg.Done()
			i := g
			for time.Now().Before(stopAt) {
				t0 := time.Now()
				if _, err := d(ctx, names[i%keys]); err != nil {
					log.Fatal(err)
				}
				lat[g] = append(lat[g], time.Since(t0))
				i += goroutines
			}
		}(g)
	}
	wg.Wait()
	elapsed := time.Since(start)
	all := slices.Concat(lat...)
	slices.Sort(all)
	return result{
		perSec: float64(len(all)) / elapsed.Seconds(),
		p50:    all[len(all)/2],
		p99:    all[len(all)*99/100],
	}
}

func median(rs []result) result {
	slices.SortFunc(rs, func(a, b result) int { return int(a.perSec - b.perSec) })
	return rs[len(rs)/2]
}

// memoryPerKey fills 100,000 keys per algorithm and reports the growth of
// used_memory divided by the number of keys.
func memoryPerKey(ctx context.Context, client *redis.Client) {
	const n = 100000
	st := redisstore.New(client, &redisstore.Options{Prefix: "m:"})
	first := true
	fmt.Printf("| algorithm | Redis bytes per key (INFO memory, %d keys) |\n|---|---|\n", n)
	// The first fill is thrown away: used_memory settles after a flush of
	// many keys only once the allocator has been through one fill.
	for _, l := range []floodgate.Limit{
		floodgate.TokenBucket(1, time.Hour, 100), floodgate.TokenBucket(1, time.Hour, 100), floodgate.FixedWindow(100, time.Hour),
		floodgate.SlidingWindow(100, time.Hour), floodgate.SlidingLog(10, time.Hour),
	} {
		client.FlushAll(ctx)
		before := usedMemory(ctx, client)
		limits := []floodgate.Limit{l}
		var wg sync.WaitGroup
		for g := 0; g < 16; g++ {
			wg.Add(1)
			go func(g int) {
				defer wg.Done()
				for i := g; i < n; i += 16 {
					if _, err := st.Take(ctx, "user:"+strconv.Itoa(i), limits, 1); err != nil {
						log.Fatal(err)
					}
				}
			}(g)
		}
		wg.Wait()
		if first {
			first = false
			continue
		}
		what := l.Algorithm().String()
		if l.Algorithm() == floodgate.AlgorithmSlidingLog {
			what += " (1 entry)"
		}
		fmt.Printf("| %s | %.0f |\n", what, float64(usedMemory(ctx, client)-before)/n)
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

func startRedis(port int) (string, func()) {
	dir, err := os.MkdirTemp("", "redisbench")
	if err != nil {
		log.Fatal(err)
	}
	addr := "127.0.0.1:" + strconv.Itoa(port)
	cmd := exec.Command("redis-server", "--port", strconv.Itoa(port), "--bind", "127.0.0.1", "--save", "",
		"--appendonly", "no", "--dir", dir, "--logfile", filepath.Join(dir, "log"))
	if err := cmd.Start(); err != nil {
		log.Fatalf("starting redis-server (install it: apt-get install redis-server): %v", err)
	}
	c := redis.NewClient(&redis.Options{Addr: addr})
	defer c.Close()
	for i := 0; i < 100 && c.Ping(context.Background()).Err() != nil; i++ {
		time.Sleep(20 * time.Millisecond)
	}
	return addr, func() { cmd.Process.Kill(); cmd.Wait(); os.RemoveAll(dir) }
}
