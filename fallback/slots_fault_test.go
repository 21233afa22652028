package fallback_test

import (
	"context"
	"syscall"
	"testing"
	"time"

	"github.com/floodgate/floodgate"
	"github.com/floodgate/floodgate/fallback"
)

// TestFaultSlots hangs Redis (SIGSTOP) while a key holds a permit from
// it: acquires go to the local share (2 of 4 slots, for 2 instances);
// once Redis is back, the local permits are released where they are,
// once, and Redis's permit on Redis, which never counted the local ones.
func TestFaultSlots(t *testing.T) {
	r := newRig(t)
	ctx := context.Background()
	c, err := floodgate.NewConcurrency(r.fb, 4, time.Minute, nil)
	if err != nil {
		t.Fatal(err)
	}
	fromRedis, err := c.Acquire(ctx, "k")
	if err != nil || !fromRedis.Allowed || fromRedis.Source != floodgate.SourceStore {
		t.Fatal(fromRedis, err)
	}
	must(t, r.srv.Signal(syscall.SIGSTOP))
	var local []floodgate.Permit
	for i := 0; i < 100 && len(local) < 3; i++ {
		res, err := c.Acquire(ctx, "k")
		if err != nil {
			t.Fatal(err)
		}
		if res.Source != floodgate.SourceLocal {
			t.Fatalf("acquire while Redis hangs: %+v", res)
		}
		if !res.Allowed {
			break
		}
		local = append(local, res.Permit)
	}
	if len(local) != 2 {
		t.Fatalf("%d local permits, want the share of 2", len(local))
	}
	must(t, r.srv.Signal(syscall.SIGCONT))
	deadline := time.Now().Add(10 * time.Second)
	for r.fb.State() != fallback.Primary {
		if time.Now().After(deadline) {
			t.Fatal("the fallback did not switch back")
		}
		time.Sleep(10 * time.Millisecond)
	}
	// Redis holds its own permit, and no local one.
	back, err := c.Acquire(ctx, "k")
	if err != nil || !back.Allowed || back.Source != floodgate.SourceStore || back.Held != 2 {
		t.Fatalf("acquire on Redis again: %+v %v", back, err)
	}
	for _, p := range local {
		if res, err := c.Release(ctx, p); err != nil || !res.Allowed || res.Source != floodgate.SourceLocal {
			t.Fatalf("release of a local permit: %+v %v", res, err)
		}
		if res, err := c.Release(ctx, p); err != nil || res.Allowed {
			t.Fatalf("second release of a local permit: %+v %v", res, err)
		}
	}
	for _, p := range []floodgate.Permit{fromRedis.Permit, back.Permit} {
		if res, err := c.Release(ctx, p); err != nil || !res.Allowed || res.Source != floodgate.SourceStore {
			t.Fatalf("release on Redis: %+v %v", res, err)
		}
	}
	if n := r.admin.Exists(ctx, "floodgate:{k}:c").Val(); n != 0 {
		t.Error("Redis keeps permits after every release")
	}
}
