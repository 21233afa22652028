package main

import (
	"context"
	"fmt"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/floodgate/floodgate/internal/testkit/redistest"
)

// A key whose Redis key holds foreign data fails only its own checks (an
// HTTP 500 and a RESP error that say so, counted in
// floodgate_key_errors_total) and leaves the service ready. Through an
// outage, the fallback (local) answers it and records it in its ledger;
// when Redis answers again, the ledger's settle fails on that key alone,
// and the service is ready again all the same.
func TestPoisonedKey(t *testing.T) {
	srv := redistest.Start(t)
	admin := srv.Admin(t)
	ctx := context.Background()
	// The example rule's state key of client key "p" (see ruleKey).
	if err := admin.RPush(ctx, "floodgate:{r7:example:p}:0b", "x").Err(); err != nil {
		t.Fatal(err)
	}
	// A budget that a loaded machine keeps (the first call loads the
	// scripts): Redis, not the fallback, answers until it hangs.
	in := serve(t, "--redis", srv.URL()+"/0", "--budget", "2s", "--fallback", "local")
	for i := range 5 {
		code, body := in.post(t, "/v1/check", `{"rule":"example","key":"p"}`)
		if code != 500 || !strings.Contains(fmt.Sprint(body["detail"]), "key failed: redis: wrong type") {
			t.Fatalf("check %d of the poisoned key: %d %v", i, code, body)
		}
	}
	if _, err := in.redis(t, nil).Do(ctx, "FG.CHECK", "example", "p").Result(); err == nil || !strings.HasPrefix(err.Error(), "ERR floodgate: key failed: redis: wrong type") {
		t.Fatalf("FG.CHECK of the poisoned key: %v", err)
	}
	if code, body := in.post(t, "/v1/check", `{"rule":"example","key":"q"}`); code != 200 || body["source"] != "store" {
		t.Fatalf("another key: %d %v", code, body)
	}
	if code, _ := in.get(t, "/readyz"); code != 200 {
		t.Fatalf("/readyz after the poisoned key's failures: %d", code)
	}
	if m := in.metrics(t); !strings.Contains(m, `floodgate_key_errors_total{rule="example",kind="wrong_type"} 6`) {
		t.Errorf("metrics do not count 6 wrong_type key errors:\n%s", grepLines(m, "key_errors"))
	}

	// An outage: Redis hangs, the fallback answers, and records "p".
	if err := srv.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "readyz 503 while Redis hangs", func() bool { code, _ := in.get(t, "/readyz"); return code == 503 })
	for _, key := range []string{"p", "q"} {
		if code, body := in.post(t, "/v1/check", `{"rule":"example","key":"`+key+`"}`); code != 200 || body["source"] != "local" {
			t.Fatalf("%s while Redis hangs: %d %v", key, code, body)
		}
	}
	if err := srv.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "readyz 200 once Redis answers, the poisoned key in the ledger", func() bool { code, _ := in.get(t, "/readyz"); return code == 200 })
	if log := in.stderr.String(); !strings.Contains(log, "dropped a key from the ledger") {
		t.Errorf("no log line of the dropped key:\n%s", log)
	}
}

// An ACL that refuses one key's Redis keys (and the probe's) fails that
// key's checks with Redis's NOPERM, not "wrong type"; the others are
// decided, and the service is ready.
func TestACLRefusal(t *testing.T) {
	srv := redistest.Start(t)
	admin := srv.Admin(t)
	ctx := context.Background()
	if err := admin.Do(ctx, "ACL", "SETUSER", "fg", "on", ">pw", "+@all", "~floodgate:{r7:example:ok*").Err(); err != nil {
		t.Fatal(err)
	}
	in := serve(t, "--redis", "redis://fg:pw@"+srv.Addr+"/0", "--budget", "2s") // a budget a loaded machine keeps
	if code, body := in.post(t, "/v1/check", `{"rule":"example","key":"ok1"}`); code != 200 || body["source"] != "store" {
		t.Fatalf("an allowed key: %d %v", code, body)
	}
	code, body := in.post(t, "/v1/check", `{"rule":"example","key":"other"}`)
	if detail := fmt.Sprint(body["detail"]); code != 500 || !strings.Contains(detail, "redis: NOPERM") || strings.Contains(detail, "wrong type") {
		t.Fatalf("a refused key: %d %v", code, body)
	}
	if code, _ := in.get(t, "/readyz"); code != 200 {
		t.Errorf("/readyz with the probe key refused: %d\n%s", code, in.stderr)
	}
	if m := in.metrics(t); !strings.Contains(m, `floodgate_key_errors_total{rule="example",kind="noperm"} 1`) {
		t.Errorf("metrics do not count the noperm key error:\n%s", grepLines(m, "key_errors"))
	}
}

// While Redis is down, go-redis's lines (a failed dial, several a second)
// reach stderr through floodgate's log, at most one a second with a count
// of those held back.
func TestRedisClientLogBounded(t *testing.T) {
	srv := redistest.Start(t)
	in := serve(t, "--redis", srv.URL()+"/0", "--budget", "20ms")
	srv.Kill()
	start := time.Now()
	for range 60 { // about 3 seconds of traffic, 20 checks a second
		in.post(t, "/v1/check", `{"rule":"example","key":"k"}`)
		time.Sleep(50 * time.Millisecond)
	}
	secs := time.Since(start).Seconds()
	log := in.stderr.String()
	raw, ours := 0, 0
	for _, line := range strings.Split(log, "\n") {
		switch {
		case strings.HasPrefix(line, "redis: "):
			raw++ // go-redis's own logger
		case strings.Contains(line, `msg="floodgate: redis client"`):
			ours++
		}
	}
	t.Logf("%d go-redis lines in %.1fs", ours, secs)
	if raw != 0 || ours == 0 || float64(ours) > secs+2 {
		t.Errorf("%d raw and %d floodgate lines from go-redis in %.1fs; want none raw, and at most one a second:\n%s", raw, ours, secs, log)
	}
	if !strings.Contains(log, "connection refused") {
		t.Errorf("no line names the refused connection:\n%s", log)
	}
}

// grepLines returns the lines of s that contain sub.
func grepLines(s, sub string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}
