package main

import (
	"bufio"
	"bytes"
	"context"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/floodgate/floodgate/bench/internal/procs"
	"github.com/redis/go-redis/v9"
)

// -slots -callgrind N counts Redis's instructions instead of its CPU
// time: it starts its own redis-server under valgrind's callgrind, runs N
// acquire+release pairs of each peer in each cell, and divides the
// server's instructions (callgrind_control's counters, zeroed before each
// peer, less the idle server's over the same time) by the pairs. Unlike
// CPU time, the count does not depend on the machine's load. Needs
// valgrind (apt-get install valgrind).
var slotsCallgrind = flag.Int("callgrind", 0, "with -slots: count redis-server's instructions per pair under callgrind, over this many pairs per peer and cell")

func slotsIrBench(levels []int, pairs int) {
	port := procs.FreePort(&stops)
	dir, err := os.MkdirTemp("", "floodgate-callgrind")
	if err != nil {
		stops.Fatal(err)
	}
	cmd := exec.Command("valgrind", "--tool=callgrind", "--callgrind-out-file="+filepath.Join(dir, "callgrind.out"),
		"redis-server", "--port", strconv.Itoa(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
		"--dir", dir, "--logfile", filepath.Join(dir, "log"))
	if err := cmd.Start(); err != nil {
		stops.Fatal("starting valgrind (apt-get install valgrind redis-server): ", err)
	}
	exited := make(chan struct{})
	go func() { cmd.Wait(); close(exited) }()
	stops.Add(func() {
		cmd.Process.Kill()
		<-exited
		os.RemoveAll(dir)
	})
	addr := "127.0.0.1:" + strconv.Itoa(port)
	ctx := context.Background()
	client := redis.NewClient(&redis.Options{Addr: addr, PoolSize: 128, ReadTimeout: time.Minute, WriteTimeout: time.Minute})
	defer client.Close()
	for i := 0; client.Ping(ctx).Err() != nil; i++ {
		select {
		case <-exited:
			stops.Fatal("redis-server under valgrind exited at start")
		default:
		}
		if i == 600 {
			stops.Fatal("redis-server under valgrind did not answer within 60s")
		}
		time.Sleep(100 * time.Millisecond)
	}
	pid := procs.RedisPID(&stops, addr)
	if pid != cmd.Process.Pid {
		stops.Fatal("the redis-server that answers is not the one under valgrind: is the port taken?")
	}
	peers, fg, cleanup := slotPeers(client)
	defer cleanup()
	fmt.Printf("Concurrency limits on one redis-server %s under callgrind; %d pairs per peer and cell; N=%d, lease %s\n\n",
		redisVersion(client), pairs, slotN, slotLease)
	fmt.Println("| load | limiter | Redis instructions per pair | script calls per pair | Redis commands per pair |")
	fmt.Println("|---|---|---|---|---|")
	for _, keys := range []int{1, 10000} {
		for _, g := range levels {
			for _, p := range peers {
				// Warm up: scripts loaded, keys' first allocations made.
				runPairsN(p.pair, g, keys, min(pairs, 200))
				idle := idleIr(pid, time.Second)
				client.ConfigResetStat(ctx)
				s0 := fg.SlotStats()
				zeroIr(pid)
				start := time.Now()
				done := runPairsN(p.pair, g, keys, pairs)
				ir := readIr(pid) - idle*time.Since(start).Seconds()
				s1 := fg.SlotStats()
				calls := 2.0
				if p.name == fgPeer {
					calls = float64(s1.ScriptCalls-s0.ScriptCalls) / float64(done)
				}
				fmt.Printf("| %d goroutines, %d keys | %s | %.0f | %.2f | %s |\n", g, keys, p.name,
					ir/float64(done), calls, commandsPerPair(ctx, client, done))
			}
		}
	}
}

// runPairsN runs n pairs on goroutines goroutines, on random keys of keys,
// and returns the pairs granted.
func runPairsN(p pairer, goroutines, keys, n int) int64 {
	ctx := context.Background()
	var left, granted atomic.Int64
	left.Store(int64(n))
	var wg sync.WaitGroup
	for range goroutines {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := left.Add(-1); i >= 0; i = left.Add(-1) {
				ok, err := p(ctx, "slot:"+strconv.Itoa(int(i)%keys))
				if err != nil {
					stops.Fatal(err)
				}
				if ok {
					granted.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	return max(granted.Load(), 1)
}

func callgrindControl(args ...string) []byte {
	out, err := exec.Command("callgrind_control", args...).Output()
	if err != nil {
		stops.Fatal("callgrind_control: ", err)
	}
	return out
}

func zeroIr(pid int) { callgrindControl("-z", strconv.Itoa(pid)) }

// readIr returns the instructions of all the server's threads since they
// were last zeroed.
func readIr(pid int) float64 {
	var total float64
	sc := bufio.NewScanner(bytes.NewReader(callgrindControl("-e", strconv.Itoa(pid))))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) == 3 && f[0] == "Th" {
			n, _ := strconv.ParseFloat(strings.ReplaceAll(f[2], ",", ""), 64)
			total += n
		}
	}
	return total
}

// idleIr returns the idle server's instructions per second, over d.
func idleIr(pid int, d time.Duration) float64 {
	zeroIr(pid)
	start := time.Now()
	time.Sleep(d)
	return readIr(pid) / time.Since(start).Seconds()
}

// commandsPerPair returns the commands Redis ran (scripts' included) per
// pair since its statistics were reset, from INFO commandstats.
func commandsPerPair(ctx context.Context, c *redis.Client, pairs int64) string {
	info, err := c.Info(ctx, "commandstats").Result()
	if err != nil {
		stops.Fatal(err)
	}
	var out []string
	for _, line := range strings.Split(info, "\r\n") {
		name, rest, ok := strings.Cut(strings.TrimPrefix(line, "cmdstat_"), ":calls=")
		if !ok || name == "info" || name == "config|resetstat" || name == "ping" {
			continue
		}
		calls, _, _ := strings.Cut(rest, ",")
		n, _ := strconv.ParseFloat(calls, 64)
		out = append(out, fmt.Sprintf("%s %.2f", name, n/float64(pairs)))
	}
	sort.Strings(out)
	return strings.Join(out, ", ")
}
