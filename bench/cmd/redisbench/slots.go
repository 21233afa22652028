package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"flag"
	"fmt"
	mrand "math/rand/v2"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/floodgate/floodgate"
	"github.com/floodgate/floodgate/redisstore"
	"github.com/redis/go-redis/v9"
)

// -slots measures concurrency limits instead: acquire+release pairs of
// floodgate's Concurrency on its Redis store against the common Redis
// semaphore, a sorted set of expiring holders with one Lua script per
// acquire and one per release (Redisson's expirable semaphore is this
// recipe), at each goroutine level on one key and on 10,000 keys. The
// peers run one after the other in each run, starting with the next peer
// each run, so that Redis's CPU time per pair is each one's own.
var slotsFlag = flag.Bool("slots", false, "measure concurrency limits (acquire+release pairs) against a ZSET semaphore, and nothing else")

// zsetAcquire is the baseline's acquire: drop the expired holders, count,
// add the holder with its expiry, keep the key as long as the lease.
var zsetAcquire = redis.NewScript(`
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
if redis.call('ZCARD', KEYS[1]) >= tonumber(ARGV[1]) then return 0 end
redis.call('ZADD', KEYS[1], now + tonumber(ARGV[2]), ARGV[3])
redis.call('PEXPIRE', KEYS[1], math.ceil(tonumber(ARGV[2]) / 1000))
return 1
`)

// zsetRelease is the baseline's release.
var zsetRelease = redis.NewScript(`return redis.call('ZREM', KEYS[1], ARGV[1])`)

// pairer acquires a slot on key and releases it; it reports whether the
// acquire was granted.
type pairer func(ctx context.Context, key string) (bool, error)

// The limit both peers apply, and the name of floodgate's peer.
const (
	slotN     = 100
	slotLease = 30 * time.Second
	fgPeer    = "floodgate Concurrency"
)

type slotPeer struct {
	name string
	pair pairer
}

// slotPeers returns floodgate's peer and the ZSET semaphore on client,
// floodgate's store, and what closes it.
func slotPeers(client *redis.Client) ([]slotPeer, *redisstore.Store, func()) {
	const n, lease = slotN, slotLease
	fg := redisstore.New(client, &redisstore.Options{Prefix: "fg:"})
	c, err := floodgate.NewConcurrency(fg, n, lease, nil)
	if err != nil {
		stops.Fatal(err)
	}
	return []slotPeer{
		{fgPeer, func(ctx context.Context, key string) (bool, error) {
			r, err := c.Acquire(ctx, key)
			if err != nil || !r.Allowed {
				return false, err
			}
			_, err = c.Release(ctx, r.Permit)
			return true, err
		}},
		{"ZSET semaphore (2 scripts)", func(ctx context.Context, key string) (bool, error) {
			var b [16]byte
			rand.Read(b[:])
			id := hex.EncodeToString(b[:])
			k := "zs:{" + key + "}"
			ok, err := zsetAcquire.Run(ctx, client, []string{k}, n, lease.Microseconds(), id).Int()
			if err != nil || ok == 0 {
				return false, err
			}
			return true, zsetRelease.Run(ctx, client, []string{k}, id).Err()
		}},
	}, fg, func() { fg.Close() }
}

func slotsBench(addr string, dur time.Duration, runs int, levels []int) {
	ctx := context.Background()
	client := redis.NewClient(&redis.Options{Addr: addr, PoolSize: 128})
	defer client.Close()
	const n, lease = slotN, slotLease
	peers, fg, cleanup := slotPeers(client)
	defer cleanup()
	fmt.Printf("Concurrency limits on one redis-server %s on loopback, %d CPUs; %d runs of %s per cell, medians; N=%d, lease %s\n\n",
		redisVersion(client), runtime.NumCPU(), runs, dur, n, lease)
	fmt.Println("| load | limiter | pairs/s | Redis CPU per pair | scripts' µs per pair | script calls per pair | denied |")
	fmt.Println("|---|---|---|---|---|---|---|")
	for _, keys := range []int{1, 10000} {
		for _, g := range levels {
			type cell struct {
				perSec, cpu, usec []float64
				calls             float64
				denied            int64
			}
			cells := make([]cell, len(peers))
			for r := range runs {
				for j := range peers {
					i := (r + j) % len(peers)
					s0 := fg.SlotStats()
					client.ConfigResetStat(ctx)
					cpu0 := redisCPU(ctx, client)
					pairs, denied, elapsed := runPairs(peers[i].pair, g, keys, dur)
					cpu := redisCPU(ctx, client) - cpu0
					s1 := fg.SlotStats()
					cl := &cells[i]
					cl.usec = append(cl.usec, scriptUsec(ctx, client)/float64(max(pairs, 1)))
					cl.perSec = append(cl.perSec, float64(pairs)/elapsed.Seconds())
					cl.cpu = append(cl.cpu, float64(cpu)/float64(max(pairs, 1)))
					cl.denied += denied
					if i == 0 {
						cl.calls = float64(s1.ScriptCalls-s0.ScriptCalls) / float64(max(pairs, 1))
					} else {
						cl.calls = 2
					}
				}
			}
			for i, p := range peers {
				cl := cells[i]
				fmt.Printf("| %d goroutines, %d keys | %s | %.0f | %s | %.1f | %.2f | %d |\n", g, keys, p.name,
					med(cl.perSec), fmtDur(time.Duration(med(cl.cpu))), med(cl.usec), cl.calls, cl.denied)
			}
		}
	}
}

// scriptUsec returns the µs Redis spent in scripts (INFO commandstats'
// eval and evalsha, which include the commands they call) since its
// statistics were reset.
func scriptUsec(ctx context.Context, c *redis.Client) float64 {
	info, err := c.Info(ctx, "commandstats").Result()
	if err != nil {
		stops.Fatal(err)
	}
	var total float64
	for _, line := range strings.Split(info, "\r\n") {
		for _, name := range []string{"cmdstat_evalsha:", "cmdstat_eval:"} {
			if rest, ok := strings.CutPrefix(line, name); ok {
				_, v, _ := strings.Cut(rest, "usec=")
				v, _, _ = strings.Cut(v, ",")
				x, _ := strconv.ParseFloat(v, 64)
				total += x
			}
		}
	}
	return total
}

func med(v []float64) float64 {
	v = slices.Clone(v)
	slices.Sort(v)
	return v[len(v)/2]
}

// runPairs runs goroutines that each do pairs on random keys of keys for
// dur, and returns the pairs granted, the acquires denied, and the time.
func runPairs(p pairer, goroutines, keys int, dur time.Duration) (pairs, denied int64, elapsed time.Duration) {
	ctx := context.Background()
	var np, nd atomic.Int64
	var stop atomic.Bool
	var wg sync.WaitGroup
	start := time.Now()
	for range goroutines {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for !stop.Load() {
				ok, err := p(ctx, "slot:"+strconv.Itoa(mrand.IntN(keys)))
				if err != nil {
					stops.Fatal(err)
				}
				if ok {
					np.Add(1)
				} else {
					nd.Add(1)
				}
			}
		}()
	}
	time.Sleep(dur)
	stop.Store(true)
	wg.Wait()
	return np.Load(), nd.Load(), time.Since(start)
}
