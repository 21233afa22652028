package service_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/floodgate/floodgate"
	"github.com/floodgate/floodgate/internal/server/config"
	"github.com/floodgate/floodgate/internal/server/service"
	"github.com/floodgate/floodgate/internal/testkit/redistest"
	"github.com/floodgate/floodgate/redisstore"
	"github.com/floodgate/floodgate/storetest"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

const rules = `rules:
  - name: api
    algorithm: token-bucket
    rate: 1
    period: 1h
    burst: 2
  - name: tiered
    limits:
      - {algorithm: fixed-window, limit: 5, window: 1h, name: hourly}
      - {algorithm: token-bucket, rate: 1, period: 1h, burst: 1}
  - name: quiet
    algorithm: fixed-window
    limit: 1
    window: 1h
    shadow: true
`

func newService(t *testing.T) *service.Service {
	t.Helper()
	st := floodgate.NewMemoryStore(&floodgate.MemoryOptions{Clock: storetest.NewClock(storetest.Base), SweepInterval: -1})
	t.Cleanup(func() { st.Close() })
	return newServiceOn(t, st, rules)
}

func newServiceOn(t *testing.T, st floodgate.Store, rules string) *service.Service {
	t.Helper()
	cfg, err := config.Parse("rules.yaml", []byte(rules))
	if err != nil {
		t.Fatal(err)
	}
	svc, err := service.New(st, cfg, &service.Options{Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	return svc
}

func TestCheck(t *testing.T) {
	svc := newService(t)
	ctx := context.Background()
	type want struct {
		allowed, decided bool
		remaining        int64
		policy           string
		err              error
	}
	tests := []struct {
		rule, key string
		cost      int64
		want      want
	}{
		{"api", "u", 1, want{true, true, 1, "api", nil}},
		{"api", "u", 1, want{true, true, 0, "api", nil}},
		{"api", "u", 1, want{false, false, 0, "api", nil}},
		{"api", "other", 0, want{true, true, 2, "api", nil}}, // a peek
		// The limit closest to denying names the result.
		{"tiered", "u", 1, want{true, true, 0, "", nil}},
		{"tiered", "u", 1, want{false, false, 0, "", nil}},
		// A shadow rule allows what it would deny.
		{"quiet", "u", 1, want{true, true, 0, "quiet", nil}},
		{"quiet", "u", 1, want{true, false, 0, "quiet", nil}},
		{"nope", "u", 1, want{err: service.ErrUnknownRule}},
		{"api", "", 1, want{err: service.ErrBadRequest}},
		{"api", string(make([]byte, service.MaxKeyLen+1)), 1, want{err: service.ErrBadRequest}},
		{"api", "u", -1, want{err: service.ErrBadRequest}},
	}
	for i, tt := range tests {
		d, err := svc.Check(ctx, tt.rule, tt.key, tt.cost)
		if tt.want.err != nil {
			if !errors.Is(err, tt.want.err) {
				t.Errorf("%d: Check(%q, %q, %d) error %v, want %v", i, tt.rule, tt.key, tt.cost, err, tt.want.err)
			}
			continue
		}
		if err != nil {
			t.Fatalf("%d: Check(%q, %q, %d): %v", i, tt.rule, tt.key, tt.cost, err)
		}
		got := want{d.Allowed, d.Result.Allowed, d.Result.Remaining, d.Limit, nil}
		if got != tt.want {
			t.Errorf("%d: Check(%q, %q, %d) = %+v, want %+v", i, tt.rule, tt.key, tt.cost, got, tt.want)
		}
	}
	if err := svc.Reset(ctx, "api", "u"); err != nil {
		t.Fatal(err)
	}
	if d, err := svc.Check(ctx, "api", "u", 1); err != nil || !d.Allowed || d.Result.Remaining != 1 {
		t.Errorf("after Reset: %+v, %v", d, err)
	}
	if err := svc.Reset(ctx, "nope", "u"); !errors.Is(err, service.ErrUnknownRule) {
		t.Errorf("Reset of an unknown rule: %v", err)
	}
}

func TestThrottle(t *testing.T) {
	svc := newService(t)
	ctx := context.Background()
	// redis-cell's README: CL.THROTTLE user123 15 30 60 on a fresh key.
	res, err := svc.Throttle(ctx, "user123", 15, 30, 60, 1)
	if err != nil || !res.Allowed || res.Quota != 16 || res.Remaining != 15 || res.ResetAfter != 2*time.Second {
		t.Fatalf("Throttle = %+v, %v", res, err)
	}
	for _, bad := range [][4]int64{{-1, 30, 60, 1}, {15, 0, 60, 1}, {15, 30, 0, 1}, {15, 30, 60, -1}} {
		if _, err := svc.Throttle(ctx, "k", bad[0], bad[1], bad[2], bad[3]); !errors.Is(err, service.ErrBadRequest) {
			t.Errorf("Throttle(%v): %v, want ErrBadRequest", bad, err)
		}
	}
}

func TestReload(t *testing.T) {
	svc := newService(t)
	path := filepath.Join(t.TempDir(), "rules.yaml")
	if err := os.WriteFile(path, []byte("rules:\n  - {name: other, algorithm: sliding-log, limit: 3, window: 1s}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := svc.Reload(path); err != nil {
		t.Fatal(err)
	}
	if _, err := svc.Check(context.Background(), "api", "u", 1); !errors.Is(err, service.ErrUnknownRule) {
		t.Errorf("a rule of the old file still answers: %v", err)
	}
	if d, err := svc.Check(context.Background(), "other", "u", 1); err != nil || d.Result.Quota != 3 {
		t.Errorf("the new rule: %+v, %v", d, err)
	}
	// An invalid file keeps the rules in use.
	if err := os.WriteFile(path, []byte("rules: [{name: x, algorithm: nope}]\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := svc.Reload(path); err == nil {
		t.Fatal("an invalid file was accepted")
	}
	if _, err := svc.Check(context.Background(), "other", "u", 1); err != nil {
		t.Errorf("the rules in use were dropped: %v", err)
	}
	if ok, failed := svc.ReloadCount(); ok != 1 || failed != 1 {
		t.Errorf("ReloadCount = %d, %d; want 1, 1", ok, failed)
	}
}

// Rules "a" and "a:b" are both valid: rule a's key "b:victim" must not
// drain rule a:b's key "victim", on any store.
func TestRuleKeysDoNotCollide(t *testing.T) {
	const collide = `rules:
  - {name: a, algorithm: fixed-window, limit: 1, window: 1h}
  - {name: "a:b", algorithm: fixed-window, limit: 1, window: 1h}
`
	stores := map[string]func(t *testing.T) floodgate.Store{
		"memory": func(t *testing.T) floodgate.Store {
			st := floodgate.NewMemoryStore(&floodgate.MemoryOptions{SweepInterval: -1})
			t.Cleanup(func() { st.Close() })
			return st
		},
		"redis": func(t *testing.T) floodgate.Store {
			st := redisstore.New(redistest.Start(t).Client(t), nil)
			t.Cleanup(func() { st.Close() })
			return st
		},
	}
	for name, newStore := range stores {
		t.Run(name, func(t *testing.T) {
			svc := newServiceOn(t, newStore(t), collide)
			ctx := context.Background()
			for range 3 {
				if _, err := svc.Check(ctx, "a", "b:victim", 1); err != nil {
					t.Fatal(err)
				}
			}
			d, err := svc.Check(ctx, "a:b", "victim", 1)
			if err != nil || !d.Allowed {
				t.Fatalf("rule a:b's key victim after rule a's key b:victim was drained: %+v, %v", d, err)
			}
		})
	}
}

// A reload that changes a rule's limits keeps what its keys used, as the
// rule's on_change says: bucket4j's example, 60 of 100 used, raised to
// 200. With two instances on one Redis, each reloading the file, the keys
// are carried once.
func TestReloadKeepsWhatWasUsed(t *testing.T) {
	const before = "rules:\n  - {name: api, algorithm: token-bucket, rate: 100, period: 1h, burst: 100}\n"
	const after = "rules:\n  - {name: api, algorithm: token-bucket, rate: 200, period: 1h, burst: 200, on_change: %s}\n"
	clock := storetest.NewClock(storetest.Base)
	srv := redistest.Start(t)
	for _, tt := range []struct {
		onChange string
		want     int64
	}{{"proportional", 80}, {"as-is", 40}, {"additive", 140}, {"reset", 200}} {
		for _, on := range []string{"memory", "redis"} {
			t.Run(on+"/"+tt.onChange, func(t *testing.T) {
				ctx := context.Background()
				var a, b floodgate.Store
				if on == "memory" {
					a = floodgate.NewMemoryStore(&floodgate.MemoryOptions{Clock: clock, SweepInterval: -1})
				} else {
					c := srv.Client(t)
					if err := srv.Admin(t).FlushAll(ctx).Err(); err != nil {
						t.Fatal(err)
					}
					a = redisstore.New(c, &redisstore.Options{Clock: clock})
					b = redisstore.New(srv.Client(t), &redisstore.Options{Clock: clock})
					t.Cleanup(func() { b.Close() })
				}
				t.Cleanup(func() { a.Close() })
				path := filepath.Join(t.TempDir(), "rules.yaml")
				write := func(s string) {
					if err := os.WriteFile(path, []byte(s), 0o644); err != nil {
						t.Fatal(err)
					}
				}
				svcs := []*service.Service{newServiceOn(t, a, before)}
				if b != nil {
					svcs = append(svcs, newServiceOn(t, b, before))
				}
				for _, svc := range svcs {
					if err := svc.Rebase(ctx); err != nil { // as floodgate serve does at start
						t.Fatal(err)
					}
				}
				if d, err := svcs[0].Check(ctx, "api", "alice", 60); err != nil || !d.Allowed || d.Result.Remaining != 40 {
					t.Fatalf("check of 60: %+v, %v", d, err)
				}
				write(fmt.Sprintf(after, tt.onChange))
				for _, svc := range svcs {
					if err := svc.Reload(path); err != nil {
						t.Fatal(err)
					}
					if d, err := svc.Peek(ctx, "api", "alice"); err != nil || d.Result.Remaining != tt.want || d.Result.Quota != 200 {
						t.Fatalf("after the reload: %d of %d left, %v; want %d of 200", d.Result.Remaining, d.Result.Quota, err, tt.want)
					}
				}
			})
		}
	}
	if _, err := config.Parse("rules.yaml", []byte(fmt.Sprintf(after, "sometimes"))); err == nil || !strings.Contains(err.Error(), "rules.yaml:2:") {
		t.Errorf("an unknown on_change: %v, want an error at rules.yaml:2", err)
	}
}

// KeyErrorKind names each kind of error about one key with one of a
// fixed set of labels.
func TestKeyErrorKind(t *testing.T) {
	tests := []struct {
		msg, want string
	}{
		{"redis: wrong type: key p:{k}:0b holds a value that is not floodgate state", "wrong_type"},
		{"redis: WRONGTYPE Operation against a key holding the wrong kind of value", "wrong_type"},
		{"redis: corrupt state: key p:{k}:0b does not hold floodgate data", "corrupt"},
		{`redis: override "x" is not floodgate's`, "corrupt"},
		{"redis: NOPERM this user has no permissions to access one of the keys used as arguments", "noperm"},
		{"redis: NOPERM permission denied in the script: The user executing the script can't access", "noperm"},
	}
	for _, tt := range tests {
		if got := service.KeyErrorKind(fmt.Errorf("%w: %s", floodgate.ErrKey, tt.msg)); got != tt.want {
			t.Errorf("KeyErrorKind(%q) = %q, want %q", tt.msg, got, tt.want)
		}
	}
}
