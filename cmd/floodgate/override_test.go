package main

import (
	"context"
	"fmt"
	"net/http"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/floodgate/floodgate/internal/testkit/redistest"
	"github.com/redis/go-redis/v9"
)

// TestOverrides is what a new user tries: give one API key a higher limit
// with one curl call on one instance, see its next request pass on another
// instance that shares the Redis, then take the override back.
func TestOverrides(t *testing.T) {
	srv := redistest.Start(t)
	path := filepath.Join(t.TempDir(), "rules.yaml")
	writeFile(t, path, "rules:\n  - name: api\n    algorithm: token-bucket\n    rate: 1\n    period: 1h\n    burst: 5\n")
	args := []string{"--config", path, "--redis", srv.URL() + "/0", "--token", "s3cret"}
	a, b := serve(t, args...), serve(t, args...)
	auth := []string{"Authorization", "Bearer s3cret"}
	check := func(in *instance, cost int) map[string]any {
		t.Helper()
		code, body := in.post(t, "/v1/check", fmt.Sprintf(`{"rule":"api","key":"alice","cost":%d}`, cost), auth...)
		if code != 200 && code != 429 {
			t.Fatalf("check: %d %v", code, body)
		}
		return body
	}
	req := func(in *instance, method, path, body string, withToken bool) (int, map[string]any) {
		t.Helper()
		r, _ := http.NewRequest(method, in.httpURL+path, strings.NewReader(body))
		r.Header.Set("Content-Type", "application/json")
		if withToken {
			r.Header.Set(auth[0], auth[1])
		}
		return do(t, r)
	}

	if body := check(b, 5); body["allowed"] != true {
		t.Fatalf("first check: %v", body)
	}
	if body := check(b, 1); body["allowed"] != false {
		t.Fatalf("check over the limit: %v", body)
	}
	premium := `{"algorithm":"token-bucket","rate":100,"period":"1h","burst":50}`
	if code, _ := req(a, "PUT", "/v1/overrides/api/alice", premium, false); code != 401 {
		t.Errorf("PUT without the token: %d, want 401", code)
	}
	code, body := req(a, "PUT", "/v1/overrides/api/alice", premium, true)
	if code != 200 || body["key"] != "alice" {
		t.Fatalf("PUT /v1/overrides/api/alice: %d %v", code, body)
	}
	// The other instance's next request: 5 of 50 used (additive), so 44
	// are left after it.
	body = check(b, 1)
	if body["allowed"] != true || body["limit"] != 50.0 || body["remaining"] != 44.0 || body["overridden"] != true {
		t.Fatalf("check on the other instance after the override: %v", body)
	}
	if code, body := req(b, "GET", "/v1/overrides/api/alice", "", true); code != 200 || fmt.Sprint(body["limits"]) == "" ||
		!strings.Contains(fmt.Sprint(body["limits"]), "burst 50") {
		t.Errorf("GET the override on the other instance: %d %v", code, body)
	}
	if code, body := req(b, "GET", "/v1/overrides?rule=api", "", true); code != 200 || !strings.Contains(fmt.Sprint(body["overrides"]), "alice") {
		t.Errorf("list the overrides: %d %v", code, body)
	}
	c := b.redis(t, &redis.Options{Password: "s3cret"})
	ctx := context.Background()
	if v, err := c.Do(ctx, "FG.OVERRIDE", "GET", "api", "alice").Result(); err != nil || fmt.Sprint(v) != "[0 token-bucket 100/1h0m0s burst 50]" {
		t.Errorf("FG.OVERRIDE GET: %v %v", v, err)
	}
	// Bad input: a clear error with where it is, and nothing changes.
	code, body = req(a, "PUT", "/v1/overrides/api/alice", `{"algorithm":"token-bucket","rate":0,"period":"1h","burst":5}`, true)
	if code != 400 || !strings.Contains(fmt.Sprint(body["detail"]), "body:1:") {
		t.Errorf("PUT an invalid limit: %d %v", code, body)
	}
	for _, tt := range []struct{ method, path, body string }{
		{"PUT", "/v1/overrides/nope/alice", premium},
		{"GET", "/v1/overrides/api/bob", ""},
	} {
		if code, _ := req(a, tt.method, tt.path, tt.body, true); code != 404 {
			t.Errorf("%s %s: %d, want 404", tt.method, tt.path, code)
		}
	}
	if _, err := c.Do(ctx, "FG.OVERRIDE", "SET", "api", "bob", `{"algorithm":"sliding-log"}`).Result(); err == nil || !strings.Contains(err.Error(), "missing") {
		t.Errorf("FG.OVERRIDE SET with a bad limit: %v", err)
	}
	if v, err := c.Do(ctx, "FG.OVERRIDE", "SET", "api", "bob", "algorithm: fixed-window\nlimit: 2\nwindow: 1h\nttl: 10m").Result(); err != nil || v != "OK" {
		t.Errorf("FG.OVERRIDE SET in YAML: %v %v", v, err)
	}
	// The TTL left is in milliseconds and time passes between SET and LIST.
	if v, err := c.Do(ctx, "FG.OVERRIDE", "LIST").Result(); err != nil || !bobListed.MatchString(fmt.Sprint(v)) {
		t.Errorf("FG.OVERRIDE LIST: %v %v", v, err)
	} else if ms, _ := strconv.Atoi(bobListed.FindStringSubmatch(fmt.Sprint(v))[1]); ms <= 590000 || ms > 600000 {
		t.Errorf("FG.OVERRIDE LIST: bob's TTL left is %d ms, want just under 600000", ms)
	}
	// Taken back, as-is: alice keeps her 44 left, up to the rule's 5.
	if code, _ := req(a, "DELETE", "/v1/overrides/api/alice?strategy=as-is", "", true); code != 204 {
		t.Fatalf("DELETE the override: %d", code)
	}
	body = check(b, 1)
	if body["allowed"] != true || body["limit"] != 5.0 || body["remaining"] != 4.0 || body["overridden"] != nil {
		t.Fatalf("check after the override was taken back: %v", body)
	}
	if v, err := c.Do(ctx, "FG.OVERRIDE", "DEL", "api", "bob", "reset").Result(); err != nil || v != "OK" {
		t.Errorf("FG.OVERRIDE DEL: %v %v", v, err)
	}
	if v, err := c.Do(ctx, "FG.OVERRIDE", "GET", "api", "bob").Result(); err != redis.Nil {
		t.Errorf("FG.OVERRIDE GET after DEL: %v %v", v, err)
	}
}

var bobListed = regexp.MustCompile(`bob (\d+) fixed-window 2/1h0m0s`)
