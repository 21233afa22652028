package redisstore_test

import (
	"context"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/floodgate/floodgate/core"
	"github.com/floodgate/floodgate/internal/testkit/redistest"
	"github.com/floodgate/floodgate/redisstore"
	"github.com/floodgate/floodgate/storetest"
	"github.com/redis/go-redis/v9"
)

// TestCallgrindIr counts a redis-server's instructions per decision of
// the fast path's batches, which, unlike its CPU time, do not move with
// the machine's load: batches of FG_IR_BATCH requests (default 10) on
// distinct keys of FG_IR_KEYS (default 200, few enough that none expires
// between its requests under callgrind), FG_IR_CALLS of them (default
// 960), one token bucket that admits them all, on a fixed clock (every
// write then sets the expiry, so no count depends on the run's speed).
// With FG_IR_FRESH set, every key is new instead (use FG_IR_KEYS=10000).
// It is a measurement, not a check, run only when FG_IR is set; it starts
// its own redis-server under callgrind:
//
//	FG_IR=1 go test -v -count=1 -run CallgrindIr ./redisstore
//
// It logs the instructions per decision (less the idle server's) and, with
// FG_IR_OUT set, copies the measured part's profile there
// (callgrind_annotate --inclusive=yes). The file and redistest's
// StartCallgrind copy unchanged into older trees, to compare commits.
func TestCallgrindIr(t *testing.T) {
	if os.Getenv("FG_IR") == "" {
		t.Skip("a measurement: set FG_IR=1 to run it")
	}
	srv := redistest.StartCallgrind(t)
	addr, pid := srv.Addr, strconv.Itoa(srv.Pid())
	env := func(name string, def int) int {
		if v, err := strconv.Atoi(os.Getenv(name)); err == nil && v > 0 {
			return v
		}
		return def
	}
	batch, nkeys, ncalls := env("FG_IR_BATCH", 10), env("FG_IR_KEYS", 200), env("FG_IR_CALLS", 960)
	ctx := context.Background()
	client := redis.NewClient(&redis.Options{Addr: addr, ReadTimeout: time.Minute, WriteTimeout: time.Minute})
	defer client.Close()
	if err := client.FlushAll(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	st := redisstore.New(client, &redisstore.Options{Prefix: "fg:", Clock: storetest.NewClock(storetest.Base)})
	defer st.Close()
	sp, err := core.NewBucket("token-bucket", 1_000_000, time.Second, 1_000_000_000, "burst")
	if err != nil {
		t.Fatal(err)
	}
	pol, err := st.Prepare([]core.Spec{sp})
	if err != nil {
		t.Fatal(err)
	}
	keys := make([]string, nkeys)
	for i := range keys {
		keys[i] = "k" + strconv.Itoa(i)
	}
	next := 0
	run := func(calls int) {
		b := make([]string, batch)
		for range calls {
			for j := range b {
				b[j] = keys[next%nkeys]
				next += 7919 // a prime: distinct keys within a batch
			}
			_, errs := st.TakeBatch(ctx, pol, b, 1)
			for _, err := range errs {
				if err != nil {
					t.Fatal(err)
				}
			}
		}
	}
	if os.Getenv("FG_IR_FRESH") != "" {
		// The library loaded, and no measured key made.
		warm := []string{"w1", "w2", "w3"}
		st.TakeBatch(ctx, pol, warm, 1)
		client.Del(ctx, "fg:{w1}:0b", "fg:{w2}:0b", "fg:{w3}:0b")
	} else {
		run(2*nkeys/batch + 10) // every key made
	}
	ctl := func(arg string) string {
		out, err := exec.Command("callgrind_control", arg, pid).Output()
		if err != nil {
			t.Fatalf("callgrind_control %s: %v", arg, err)
		}
		return string(out)
	}
	read := func() float64 { // every thread's instructions since the last -z
		var total float64
		for _, line := range strings.Split(ctl("-e"), "\n") {
			if f := strings.Fields(line); len(f) == 3 && f[0] == "Th" {
				n, _ := strconv.ParseFloat(strings.ReplaceAll(f[2], ",", ""), 64)
				total += n
			}
		}
		return total
	}
	ctl("-z")
	start := time.Now()
	time.Sleep(2 * time.Second)
	idle := read() / time.Since(start).Seconds()
	ctl("-z")
	start = time.Now()
	run(ncalls)
	ir := read() - idle*time.Since(start).Seconds()
	ctl("-d")
	if out := os.Getenv("FG_IR_OUT"); out != "" {
		if b, err := os.ReadFile(srv.CallgrindOut() + ".1"); err != nil {
			t.Error(err)
		} else if err := os.WriteFile(out, b, 0o644); err != nil {
			t.Error(err)
		}
	}
	t.Logf("batches of %d, %d calls: %.0f instructions per decision (idle server: %.0f/s)", batch, ncalls, ir/float64(batch*ncalls), idle)
}
