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
