package fallback_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/floodgate/floodgate"
	"github.com/floodgate/floodgate/core"
	"github.com/floodgate/floodgate/fallback"
	"github.com/floodgate/floodgate/internal/redistest"
	"github.com/floodgate/floodgate/redisstore"
	"github.com/redis/go-redis/v9"
)

// The fault tests run a fallback store over a real redis-server that the
// test starts, put it under load from several goroutines, break the server
// in the ways production breaks it, and check that callers never see an
// error, that local decisions stay within the local share of the limit,
// and that decisions come from Redis again within a second of its return.

const (
	faultInstances = 2
	recoveryWithin = time.Second
)

// faultLimit is the global limit; each of faultInstances processes gets
// half of it while Redis is away.
var faultLimit = floodgate.TokenBucket(400, time.Second, 40)

type rig struct {
	srv    *redistest.Server
	client *redis.Client
	fb     *fallback.Store
}

func newRig(t *testing.T) *rig {
	t.Helper()
	srv := redistest.Start(t)
	client := redis.NewClient(&redis.Options{
		Addr: srv.Addr, ContextTimeoutEnabled: true, DialTimeout: 100 * time.Millisecond,
		MaxRetries: -1, PoolSize: 16,
	})
	rs := redisstore.New(client, nil)
	fb := fallback.New(rs, &fallback.Options{
		Instances: faultInstances, Budget: 50 * time.Millisecond, ProbeInterval: 50 * time.Millisecond,
		Logger: slog.New(slog.NewTextHandler(testWriter{t}, nil)),
	})
	t.Cleanup(func() {
		fb.Close()
		rs.Close()
		client.Close()
	})
	return &rig{srv: srv, client: client, fb: fb}
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimSpace(string(p)))
	return len(p), nil
}

// load drives a store from several goroutines, each on its own key, until
// stop, and records what it saw.
type load struct {
	errs      atomic.Int64
	firstErr  atomic.Value
	bySource  [4]atomic.Int64
	lastStore atomic.Int64 // UnixNano of the latest decision from Redis
	mu        sync.Mutex
	local     map[string][]time.Time // admitted local decisions per key
	stop      chan struct{}
	wg        sync.WaitGroup
}

func startLoad(t *testing.T, s floodgate.Store, prefix string, workers int) *load {
	l := &load{local: map[string][]time.Time{}, stop: make(chan struct{})}
	lim := limiter(t, s, faultLimit)
	for w := range workers {
		key := fmt.Sprintf("%s-%d", prefix, w)
		l.wg.Add(1)
		go func() {
			defer l.wg.Done()
			tick := time.NewTicker(500 * time.Microsecond)
			defer tick.Stop()
			for {
				select {
				case <-l.stop:
					return
				case <-tick.C:
				}
				r, err := lim.Allow(context.Background(), key)
				if err != nil {
					l.errs.Add(1)
					l.firstErr.CompareAndSwap(nil, err.Error())
					continue
				}
				l.bySource[r.Source].Add(1)
				switch r.Source {
				case floodgate.SourceStore:
					l.lastStore.Store(time.Now().UnixNano())
				case floodgate.SourceLocal:
					if r.Allowed {
						l.mu.Lock()
						l.local[key] = append(l.local[key], time.Now())
						l.mu.Unlock()
					}
				}
			}
		}()
	}
	t.Cleanup(l.end)
	return l
}

func (l *load) end() {
	select {
	case <-l.stop:
	default:
		close(l.stop)
	}
	l.wg.Wait()
}

// waitStore waits, at most within, until a decision made after since
// comes from Redis, and returns how long that took.
func (l *load) waitStore(t *testing.T, since time.Time, within time.Duration) time.Duration {
	t.Helper()
	for deadline := since.Add(within); time.Now().Before(deadline); time.Sleep(2 * time.Millisecond) {
		if last := l.lastStore.Load(); last > since.UnixNano() {
			return time.Duration(last - since.UnixNano())
		}
	}
	t.Fatalf("no decision came from Redis within %s of its return", within)
	return 0
}

// check verifies zero errors and that every key's local admissions fit
// the local share: burst + rate * elapsed.
func (l *load) check(t *testing.T) {
	t.Helper()
	if n := l.errs.Load(); n != 0 {
		t.Errorf("callers saw %d errors, the first: %v", n, l.firstErr.Load())
	}
	share := mustSpec(core.NewBucket("token-bucket", faultLimit.Rate(), faultLimit.Period(), faultLimit.Quota(), "burst"))
	share, err := share.Share(faultInstances)
	if err != nil {
		t.Fatal(err)
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	for key, times := range l.local {
		elapsed := times[len(times)-1].Sub(times[0])
		most := share.Quota + elapsed.Microseconds()*share.Rate/share.Period + 1
		if int64(len(times)) > most {
			t.Errorf("%s: the local limiter admitted %d in %s, more than its share allows (%d)", key, len(times), elapsed, most)
		}
	}
	t.Logf("decisions: %d from Redis, %d local; callers saw %d errors", l.bySource[floodgate.SourceStore].Load(), l.bySource[floodgate.SourceLocal].Load(), l.errs.Load())
}

// warm waits until the load gets decisions from Redis.
func (l *load) warm(t *testing.T) {
	t.Helper()
	l.waitStore(t, time.Now(), 5*time.Second)
}

// outage runs the load against a broken Redis for a while and checks that
// local decisions took over.
func outage(t *testing.T, l *load, fb *fallback.Store) {
	t.Helper()
	before := l.bySource[floodgate.SourceLocal].Load()
	deadline := time.Now().Add(5 * time.Second)
	for fb.State() != fallback.Degraded && time.Now().Before(deadline) {
		time.Sleep(2 * time.Millisecond)
	}
	if fb.State() != fallback.Degraded {
		t.Fatal("the breaker did not open")
	}
	time.Sleep(300 * time.Millisecond)
	if l.bySource[floodgate.SourceLocal].Load() == before {
		t.Fatal("no local decisions during the outage")
	}
}

// TestFaults breaks Redis under load in each way, then heals it.
func TestFaults(t *testing.T) {
	ctx := context.Background()
	tests := []struct {
		name        string
		fault, heal func(t *testing.T, r *rig)
	}{
		{"kill",
			func(t *testing.T, r *rig) { r.srv.Kill() },
			func(t *testing.T, r *rig) { r.srv.Restart(t) }},
		{"hang", // SIGSTOP: connections stay open, replies never come
			func(t *testing.T, r *rig) { must(t, r.srv.Signal(syscall.SIGSTOP)) },
			func(t *testing.T, r *rig) { must(t, r.srv.Signal(syscall.SIGCONT)) }},
		{"restart", // a clean shutdown and start, as in an upgrade: no scripts, no keys
			func(t *testing.T, r *rig) { r.client.ShutdownNoSave(ctx) }, // its reply is the closed connection
			func(t *testing.T, r *rig) { r.srv.Restart(t) }},
		{"maxmemory", // full with noeviction: every write is refused
			func(t *testing.T, r *rig) {
				must(t, r.client.ConfigSet(ctx, "maxmemory-policy", "noeviction").Err())
				must(t, r.client.ConfigSet(ctx, "maxmemory", "1").Err()) // below what it uses
			},
			func(t *testing.T, r *rig) { must(t, r.client.ConfigSet(ctx, "maxmemory", "0").Err()) }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := newRig(t)
			l := startLoad(t, r.fb, tt.name, 8)
			l.warm(t)
			tt.fault(t, r)
			outage(t, l, r.fb)
			tt.heal(t, r)
			t.Logf("back on Redis %s after it was healed", l.waitStore(t, time.Now(), recoveryWithin))
			l.end()
			l.check(t)
		})
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// SCRIPT FLUSH is not a failure at all: the script is reloaded on NOSCRIPT.
func TestFaultScriptFlush(t *testing.T) {
	r := newRig(t)
	l := startLoad(t, r.fb, "flush", 8)
	l.warm(t)
	for range 20 {
		if err := r.client.ScriptFlush(context.Background()).Err(); err != nil {
			t.Fatal(err)
		}
		time.Sleep(5 * time.Millisecond)
	}
	l.warm(t)
	l.end()
	l.check(t)
	if s := r.fb.Stats(); s.Failures != 0 || s.Switches != 0 {
		t.Errorf("SCRIPT FLUSH counted as a failure: %+v", s)
	}
}

// The go-zero vectors that need a broken Redis.
func TestGoZeroVectors(t *testing.T) {
	// go-zero/TestPeriodLimit_RedisUnavailable: a store on a Redis that is
	// gone fails with an error; the fallback answers instead.
	t.Run("go-zero/TestPeriodLimit_RedisUnavailable", func(t *testing.T) {
		r := newRig(t)
		r.srv.Kill()
		limits := []floodgate.Limit{floodgate.FixedWindow(5, time.Second)}
		rs := redisstore.New(r.client, nil)
		defer rs.Close()
		if _, err := limiter(t, rs, limits...).Allow(context.Background(), "first"); !errors.Is(err, floodgate.ErrStore) {
			t.Errorf("redis store on a dead Redis: err = %v, want ErrStore", err)
		}
		res, err := limiter(t, r.fb, limits...).Allow(context.Background(), "first")
		if err != nil || !res.Allowed || res.Source != floodgate.SourceLocal {
			t.Errorf("fallback on a dead Redis: %+v, %v", res, err)
		}
	})
	// go-zero/TestTokenLimit_Rescue: rate 5/s, burst 10; Redis stopped
	// before 100 requests 10ms apart and restarted at the 50th; at least
	// 15 pass.
	t.Run("go-zero/TestTokenLimit_Rescue", func(t *testing.T) {
		r := newRig(t)
		limits := []floodgate.Limit{floodgate.TokenBucket(5, time.Second, 10)}
		lim := limiter(t, r.fb, limits...)
		r.srv.Kill()
		allowed := 0
		tick := time.NewTicker(10 * time.Millisecond)
		defer tick.Stop()
		for i := range 100 {
			if i == 50 {
				r.srv.Restart(t)
			}
			<-tick.C
			res, err := lim.Allow(context.Background(), "tokenlimit")
			if err != nil {
				t.Fatalf("request %d: %v", i, err)
			}
			if res.Allowed {
				allowed++
			}
		}
		if allowed < 15 {
			t.Errorf("allowed %d, want at least 15", allowed)
		}
	})
}

func mustSpec(s core.Spec, err error) core.Spec {
	if err != nil {
		panic(err)
	}
	return s
}
