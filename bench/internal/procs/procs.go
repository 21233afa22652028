// Package procs starts the servers the comparison programs measure
// against: a redis-server, and floodgate serve.
package procs

import (
	"context"
	"errors"
	"fmt"
	"log"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"
)

// StartRedis starts a redis-server on the loopback port (0: a free one),
// keeping nothing on disk, waits until it answers, and returns its
// address. Its stop is added to stops as soon as the process starts, so
// that a signal while it starts stops it too. It exits the program
// (stops.Fatal) if the server does not start, or if the server that
// answers on the port is not the one it started: a port already taken by
// another redis-server would otherwise be measured, and written to, in
// its place.
func StartRedis(stops *Stops, port int) string {
	if port == 0 {
		port = FreePort(stops)
	}
	addr, _, err := startServer(stops, port, "floodgate-bench")
	if err != nil {
		stops.Fatal(err)
	}
	return addr
}

// FreePort returns a loopback TCP port that nothing listened on a moment
// ago, whose Redis Cluster bus port (10000 above it) is free too. It
// exits the program (stops.Fatal) when it finds none.
func FreePort(stops *Stops) int {
	for range 100 {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			stops.Fatal(err)
		}
		port := ln.Addr().(*net.TCPAddr).Port
		ln.Close()
		if port+10000 > 65535 {
			continue
		}
		if bus, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(port+10000)); err == nil {
			bus.Close()
			return port
		}
	}
	stops.Fatal("no free loopback port pair found")
	return 0
}

// startServer starts a redis-server on the loopback port with extra
// arguments, in a new temporary directory named after prefix, adds its
// stop to stops as soon as the process starts, and waits until it
// answers. It fails if the process exits, or if what answers on the port
// is another process. The stop it returns is safe to call more than once.
func startServer(stops *Stops, port int, prefix string, extra ...string) (string, func(), error) {
	dir, err := os.MkdirTemp("", prefix)
	if err != nil {
		return "", nil, err
	}
	addr := "127.0.0.1:" + strconv.Itoa(port)
	args := append([]string{"--port", strconv.Itoa(port), "--bind", "127.0.0.1", "--save", "",
		"--appendonly", "no", "--dir", dir, "--logfile", filepath.Join(dir, "log")}, extra...)
	cmd := exec.Command("redis-server", args...)
	if err := cmd.Start(); err != nil {
		os.RemoveAll(dir)
		return "", nil, fmt.Errorf("starting redis-server (install it: apt-get install redis-server): %w", err)
	}
	exited := make(chan struct{})
	go func() { cmd.Wait(); close(exited) }()
	stop := func() {
		cmd.Process.Kill()
		<-exited
		os.RemoveAll(dir)
	}
	stops.Add(stop)
	c := redis.NewClient(&redis.Options{Addr: addr})
	defer c.Close()
	for i := 0; ; i++ {
		select {
		case <-exited:
			logged, _ := os.ReadFile(filepath.Join(dir, "log"))
			os.RemoveAll(dir)
			return "", nil, fmt.Errorf("redis-server on %s exited at start: %s", addr, strings.TrimSpace(string(logged)))
		default:
		}
		if c.Ping(context.Background()).Err() == nil {
			break
		}
		if i == 100 {
			stop()
			return "", nil, fmt.Errorf("redis-server on %s did not answer within 2s", addr)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if pid, err := serverPID(c); err != nil || pid != cmd.Process.Pid {
		stop()
		return "", nil, fmt.Errorf("%s answers, but not as the redis-server started here (process %d, answering %d, %v): is the port taken?", addr, cmd.Process.Pid, pid, err)
	}
	return addr, stop, nil
}

// RedisPID returns the process ID of the redis-server at addr, or exits
// the program (stops.Fatal) when it cannot ask.
func RedisPID(stops *Stops, addr string) int {
	c := redis.NewClient(&redis.Options{Addr: addr})
	defer c.Close()
	pid, err := serverPID(c)
	if err != nil {
		stops.Fatal(err)
	}
	return pid
}

// serverPID returns the process_id that the server c talks to reports.
func serverPID(c *redis.Client) (int, error) {
	info, err := c.Info(context.Background(), "server").Result()
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(info, "\r\n") {
		if v, ok := strings.CutPrefix(line, "process_id:"); ok {
			return strconv.Atoi(v)
		}
	}
	return 0, errors.New("redis-server did not say its process_id")
}

// CPU returns the user and system CPU time the process pid has used so
// far, from /proc, or exits the program (stops.Fatal) when the process
// is gone.
func CPU(stops *Stops, pid int) time.Duration {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		stops.Fatal(err)
	}
	// The fields after the command name, which is in parentheses: utime
	// and stime are the 12th and 13th of them, in clock ticks (100 a
	// second on Linux).
	f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+1:]))
	utime, _ := strconv.ParseInt(f[11], 10, 64)
	stime, _ := strconv.ParseInt(f[12], 10, 64)
	return time.Duration(utime+stime) * 10 * time.Millisecond
}

// Stolen is a reading of the machine's CPU time: what every CPU spent,
// and the part of it that the hypervisor gave to other guests (steal), in
// clock ticks since boot, from /proc/stat.
type Stolen struct{ Total, Steal int64 }

// ReadStolen reads the machine's CPU time so far. On a machine that is
// not a guest, or without /proc, steal is 0.
func ReadStolen() Stolen {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return Stolen{}
	}
	line, _, _ := strings.Cut(string(b), "\n")
	// cpu user nice system idle iowait irq softirq steal [guest guest_nice]:
	// guest time is counted in user time already.
	f := strings.Fields(line)
	if len(f) < 9 {
		return Stolen{}
	}
	var r Stolen
	for _, v := range f[1:9] {
		n, _ := strconv.ParseInt(v, 10, 64)
		r.Total += n
	}
	r.Steal, _ = strconv.ParseInt(f[8], 10, 64)
	return r
}

// Note is the line the comparison programs end with: the share of the
// machine's CPU time since the reading s that the hypervisor gave to
// others. Above a few percent the host is busy, and the timings of the
// runs move with it.
func (s Stolen) Note() string {
	now, share := ReadStolen(), 0.0
	if now.Total > s.Total {
		share = float64(now.Steal-s.Steal) / float64(now.Total-s.Total)
	}
	return fmt.Sprintf("The host took %.1f%% of this machine's CPU time during the runs (steal, /proc/stat): above a few percent, the timings move with the host's load as well as with the code.", 100*share)
}

// StartCluster starts a Redis Cluster of masters redis-servers (no
// replicas) on free loopback ports, splits the 16384 slots evenly among
// them, waits until every node reports cluster_state:ok, and returns their
// addresses and a function that stops them all. Each server's stop is
// added to stops as it starts, so that a signal while the cluster forms
// stops the servers started so far; a failure exits the program
// (stops.Fatal).
func StartCluster(stops *Stops, masters int) ([]string, func()) {
	var addrs []string
	var started []func()
	stop := func() {
		for _, s := range started {
			s()
		}
	}
	for range masters {
		addr, stopOne, err := startServer(stops, FreePort(stops), "floodgate-cluster",
			"--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf")
		if err != nil {
			stops.Fatal(err)
		}
		started = append(started, stopOne)
		addrs = append(addrs, addr)
	}
	ctx := context.Background()
	clients := make([]*redis.Client, masters)
	for i, a := range addrs {
		clients[i] = redis.NewClient(&redis.Options{Addr: a})
		defer clients[i].Close()
	}
	for i, c := range clients {
		if i > 0 {
			host, port, _ := strings.Cut(addrs[0], ":")
			if err := c.ClusterMeet(ctx, host, port).Err(); err != nil {
				stops.Fatal(err)
			}
		}
		lo, hi := i*16384/masters, (i+1)*16384/masters-1
		if err := c.Do(ctx, "CLUSTER", "ADDSLOTSRANGE", lo, hi).Err(); err != nil {
			stops.Fatal(err)
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
			stops.Fatal("the cluster did not come up within 15s")
		}
	}
	return addrs, stop
}

// Stops holds what a program started, to stop on every way out: the end
// of main (defer Run), and SIGINT or SIGTERM (OnSignal). Run stops them
// the latest first, once, whichever comes first; a stop added for
// something the program also stops itself must be safe to call twice, as
// StartRedis's and StartCluster's are. The zero value is ready to use.
type Stops struct {
	mu    sync.Mutex
	fs    []func()
	ended bool
}

// Add adds f to the stops. Once they have run, it runs f at once: a
// server that starts while a signal stops the others (on another
// goroutine) is stopped too, not left behind.
func (s *Stops) Add(f func()) {
	s.mu.Lock()
	if s.ended {
		s.mu.Unlock()
		f()
		return
	}
	s.fs = append(s.fs, f)
	s.mu.Unlock()
}

// Run runs the stops, the latest first; only its first call does.
func (s *Stops) Run() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ended {
		return
	}
	s.ended = true
	for i := len(s.fs) - 1; i >= 0; i-- {
		s.fs[i]()
	}
}

// Fatal runs the stops, then logs v and exits the program with status 1,
// as log.Fatal does. It may be called from any goroutine; log.Fatal
// itself would leave what the program started running.
func (s *Stops) Fatal(v ...any) {
	s.Run()
	log.Fatal(v...)
}

// OnSignal makes SIGINT and SIGTERM run the stops and exit the program
// with status 1, rather than leave what it started running. Its
// goroutine lives as long as the program.
func (s *Stops) OnSignal() {
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, os.Interrupt, syscall.SIGTERM)
	go func() {
		<-sig
		s.Run()
		os.Exit(1)
	}()
}
