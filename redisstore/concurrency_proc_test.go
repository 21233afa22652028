package redisstore_test

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"github.com/floodgate/floodgate"
	"github.com/floodgate/floodgate/internal/testkit/redistest"
	"github.com/floodgate/floodgate/redisstore"
)

// The holder processes of TestSlotsExactAcrossProcesses and
// TestSlotsCrashFreesAfterLease are this test binary, run with
// -test.run=TestSlotHolderProcess and the environment below.
const (
	envHolder  = "FLOODGATE_SLOT_HOLDER" // "churn" or "hold"
	envURL     = "FLOODGATE_SLOT_URL"
	envShared  = "FLOODGATE_SLOT_SHARED" // churn: the file of the shared counter
	envRounds  = "FLOODGATE_SLOT_ROUNDS"
	slotsN     = 5
	slotsKey   = "api-key:42"
	sharedSize = 4096
)

// sharedCounter maps the file path (one page) and returns its first 8
// bytes as a counter that every process mapping it shares.
func sharedCounter(t testing.TB, path string) *atomic.Int64 {
	t.Helper()
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := f.Truncate(sharedSize); err != nil {
		t.Fatal(err)
	}
	b, err := syscall.Mmap(int(f.Fd()), 0, sharedSize, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_SHARED)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { syscall.Munmap(b) })
	return (*atomic.Int64)(unsafe.Pointer(&b[0]))
}

// TestSlotHolderProcess is a holder process; it does nothing in a normal
// run. "churn": 32 goroutines acquire a slot, add 1 to the shared counter
// (once the acquire has returned), hold it a moment, take 1 off (before
// the release is sent) and release, for the rounds asked. "hold":
// acquire every slot it can, print each permit's expiry, and wait to be
// killed.
func TestSlotHolderProcess(t *testing.T) {
	role := os.Getenv(envHolder)
	if role == "" {
		t.Skip("run by the tests that start holder processes")
	}
	st, err := redisstore.NewFromURL(os.Getenv(envURL), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	ctx := context.Background()
	switch role {
	case "churn":
		c, err := floodgate.NewConcurrency(st, slotsN, 30*time.Second, nil)
		if err != nil {
			t.Fatal(err)
		}
		shared := sharedCounter(t, os.Getenv(envShared))
		rounds, _ := strconv.Atoi(os.Getenv(envRounds))
		var wg sync.WaitGroup
		var granted atomic.Int64
		for g := range 32 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := range rounds {
					r, err := c.Acquire(ctx, slotsKey)
					if err != nil {
						t.Error(err)
						return
					}
					if !r.Allowed {
						continue
					}
					granted.Add(1)
					shared.Add(1)
					if (g+i)%4 == 0 {
						time.Sleep(time.Millisecond)
					}
					shared.Add(-1)
					if rel, err := c.Release(ctx, r.Permit); err != nil || !rel.Allowed {
						t.Errorf("release: %+v %v", rel, err)
						return
					}
				}
			}()
		}
		wg.Wait()
		fmt.Printf("granted %d\n", granted.Load())
	case "hold":
		c, err := floodgate.NewConcurrency(st, slotsN, 2*time.Second, nil)
		if err != nil {
			t.Fatal(err)
		}
		for {
			r, err := c.Acquire(ctx, slotsKey)
			if err != nil {
				t.Fatal(err)
			}
			if !r.Allowed {
				break
			}
			fmt.Printf("expires %d\n", r.Permit.Expires.UnixMicro())
		}
		fmt.Println("holding")
		time.Sleep(time.Minute) // until killed
	}
}

func holder(t *testing.T, role, url string, env ...string) *exec.Cmd {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestSlotHolderProcess$", "-test.v")
	cmd.Env = append(os.Environ(), append(env, envHolder+"="+role, envURL+"="+url)...)
	return cmd
}

// TestSlotsExactAcrossProcesses runs 3 processes of 32 goroutines that
// acquire and release one key of 5 slots over one redis-server, and
// samples, until they end, the holders' shared count (each holder counts
// itself between its acquire and its release) and the live permits in
// Redis: neither is ever more than 5.
func TestSlotsExactAcrossProcesses(t *testing.T) {
	srv := redistest.Start(t)
	admin := srv.Admin(t)
	path := filepath.Join(t.TempDir(), "holders")
	shared := sharedCounter(t, path)
	var cmds []*exec.Cmd
	outs := make([]*strings.Builder, 3)
	for i := range 3 {
		cmd := holder(t, "churn", srv.URL(), envShared+"="+path, envRounds+"=60")
		outs[i] = &strings.Builder{}
		cmd.Stdout, cmd.Stderr = outs[i], outs[i]
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		cmds = append(cmds, cmd)
	}
	done := make(chan error, len(cmds))
	for _, cmd := range cmds {
		go func() { done <- cmd.Wait() }()
	}
	ctx := context.Background()
	key := "floodgate:{" + slotsKey + "}:c"
	var samples, mostHeld, mostLive int64
	for running := len(cmds); running > 0; {
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("a holder failed: %v", err)
			}
			running--
			continue
		default:
		}
		h := shared.Load()
		now, err := admin.Time(ctx).Result()
		if err != nil {
			t.Fatal(err)
		}
		live, err := admin.ZCount(ctx, key, "("+strconv.FormatInt(now.UnixMicro(), 10), "+inf").Result()
		if err != nil {
			t.Fatal(err)
		}
		samples++
		mostHeld, mostLive = max(mostHeld, h), max(mostLive, live)
		if h > slotsN || live > slotsN {
			t.Fatalf("%d holders and %d live permits at once, limit %d", h, live, slotsN)
		}
	}
	for i, o := range outs {
		if !strings.Contains(o.String(), "granted ") || t.Failed() {
			t.Logf("holder %d:\n%s", i, o)
		}
	}
	t.Logf("%d samples: at most %d holders, %d live permits", samples, mostHeld, mostLive)
	if mostLive < 2 || samples < 10 {
		t.Errorf("the holders never contended: %d samples, at most %d live", samples, mostLive)
	}
	if n := admin.Exists(ctx, key).Val(); n != 0 {
		t.Errorf("permits are left after every release: %v", admin.ZRange(ctx, key, 0, -1).Val())
	}
}

// TestSlotsCrashFreesAfterLease SIGKILLs a process that holds every slot
// of a key (lease 2s, on Redis's clock): an acquire is denied until the
// earliest of its permits expires, never granted before, and granted at
// the first try after it (the sweep is the acquire itself).
func TestSlotsCrashFreesAfterLease(t *testing.T) {
	srv := redistest.Start(t)
	cmd := holder(t, "hold", srv.URL())
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var expiries []int64
	sc := bufio.NewScanner(stdout)
	for sc.Scan() && sc.Text() != "holding" {
		if v, ok := strings.CutPrefix(sc.Text(), "expires "); ok {
			e, _ := strconv.ParseInt(v, 10, 64)
			expiries = append(expiries, e)
		}
	}
	if len(expiries) != slotsN {
		t.Fatalf("the holder took %d slots, want %d", len(expiries), slotsN)
	}
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	cmd.Wait()

	st := newStore(t, srv.Client(t), nil)
	c, err := floodgate.NewConcurrency(st, slotsN, 2*time.Second, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	const poll = 20 * time.Millisecond
	deadline := time.Now().Add(10 * time.Second)
	for {
		r, err := c.Acquire(ctx, slotsKey)
		if err != nil {
			t.Fatal(err)
		}
		at := r.Permit.Expires.UnixMicro() - c.Lease().Microseconds() // Redis's now at the grant
		if r.Allowed {
			switch {
			case at < expiries[0]:
				t.Fatalf("a slot of the killed holder was free %dµs before its lease ended", expiries[0]-at)
			case at > expiries[0]+(poll+500*time.Millisecond).Microseconds():
				t.Errorf("a slot came back %dµs after its lease ended, more than one poll", at-expiries[0])
			}
			t.Logf("the first slot came back %dµs after the lease ended", at-expiries[0])
			break
		}
		if r.Held != slotsN || r.RetryAfter <= 0 || r.RetryAfter > c.Lease() {
			t.Fatalf("denied with %+v", r)
		}
		if time.Now().After(deadline) {
			t.Fatal("the killed holder's slots never came back")
		}
		time.Sleep(poll)
	}
}
