// Package procs starts the servers the comparison programs measure
// against: a redis-server, and floodgate serve.
package procs

import (
	"context"
	"log"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// StartRedis starts a redis-server on the loopback port, keeping nothing
// on disk, waits until it answers, and returns its address and a function
// that stops it.
func StartRedis(port int) (string, func()) {
	dir, err := os.MkdirTemp("", "floodgate-bench")
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

// RedisPID returns the process ID of the redis-server at addr.
func RedisPID(addr string) int {
	c := redis.NewClient(&redis.Options{Addr: addr})
	defer c.Close()
	info, err := c.Info(context.Background(), "server").Result()
	if err != nil {
		log.Fatal(err)
	}
	for _, line := range strings.Split(info, "\r\n") {
		if v, ok := strings.CutPrefix(line, "process_id:"); ok {
			pid, _ := strconv.Atoi(v)
			return pid
		}
	}
	log.Fatal("redis-server did not say its process_id")
	return 0
}

// CPU returns the user and system CPU time the process pid has used so
// far, from /proc.
func CPU(pid int) time.Duration {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		log.Fatal(err)
	}
	// The fields after the command name, which is in parentheses: utime
	// and stime are the 12th and 13th of them, in clock ticks (100 a
	// second on Linux).
	f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+1:]))
	utime, _ := strconv.ParseInt(f[11], 10, 64)
	stime, _ := strconv.ParseInt(f[12], 10, 64)
	return time.Duration(utime+stime) * 10 * time.Millisecond
}

// StartCluster starts a Redis Cluster of masters redis-servers (no
// replicas) on loopback ports from firstPort up, splits the 16384 slots
// evenly among them, waits until every node reports cluster_state:ok,
// and returns their addresses and a function that stops them all.
func StartCluster(masters, firstPort int) ([]string, func()) {
	var addrs []string
	var stops []func()
	stop := func() {
		for _, s := range stops {
			s()
		}
	}
	for i := range masters {
		port := firstPort + i
		dir, err := os.MkdirTemp("", "floodgate-cluster")
		if err != nil {
			log.Fatal(err)
		}
		cmd := exec.Command("redis-server", "--port", strconv.Itoa(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
			"--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf", "--dir", dir, "--logfile", filepath.Join(dir, "log"))
		if err := cmd.Start(); err != nil {
			stop()
			log.Fatalf("starting redis-server: %v", err)
		}
		stops = append(stops, func() { cmd.Process.Kill(); cmd.Wait(); os.RemoveAll(dir) })
		addrs = append(addrs, "127.0.0.1:"+strconv.Itoa(port))
	}
	ctx := context.Background()
	clients := make([]*redis.Client, masters)
	for i, a := range addrs {
		clients[i] = redis.NewClient(&redis.Options{Addr: a})
		defer clients[i].Close()
		for j := 0; j < 100 && clients[i].Ping(ctx).Err() != nil; j++ {
			time.Sleep(20 * time.Millisecond)
		}
	}
	for i, c := range clients {
		if i > 0 {
			host, port, _ := strings.Cut(addrs[0], ":")
			if err := c.ClusterMeet(ctx, host, port).Err(); err != nil {
				stop()
				log.Fatal(err)
			}
		}
		lo, hi := i*16384/masters, (i+1)*16384/masters-1
		if err := c.Do(ctx, "CLUSTER", "ADDSLOTSRANGE", lo, hi).Err(); err != nil {
			stop()
			log.Fatal(err)
		}
	}
	for _, c := range clients {
		ok := false
		for j := 0; j < 300 && !ok; j++ {
			info, _ := c.ClusterInfo(ctx).Result()
			if ok = strings.Contains(info, "cluster_state:ok") && strings.Contains(info, "cluster_known_nodes:"+strconv.Itoa(masters)); !ok {
				time.Sleep(50 * time.Millisecond)
			}
		}
		if !ok {
			stop()
			log.Fatal("the cluster did not come up within 15s")
		}
	}
	return addrs, stop
}
