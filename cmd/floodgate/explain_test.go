package main

import (
	"context"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/floodgate/floodgate/internal/testkit/redistest"
	"github.com/redis/go-redis/v9"
)

// The explain API through serve, as an operator asks it: behind --token
// on HTTP and the Redis protocol, on Redis behind the fallback with the
// denial cache, for a rule and for an Envoy request.
func TestExplainServe(t *testing.T) {
	srv := redistest.Start(t)
	dir := t.TempDir()
	writeFile(t, filepath.Join(dir, "rules.yaml"), "rules:\n  - name: api\n    algorithm: token-bucket\n    rate: 1\n    period: 1h\n    burst: 1\n")
	writeFile(t, filepath.Join(dir, "edge.yaml"), "domain: edge\ndescriptors:\n  - key: path\n    value: /login\n    descriptors:\n      - key: remote_address\n        rate_limit: {unit: minute, requests_per_unit: 1}\n")
	in := serve(t, "--redis", srv.URL()+"/0", "--config", dir, "--token", "s3cret", "--denial-cache", "--instances", "4", "--budget", "5s")
	ctx := context.Background()
	auth := []string{"Authorization", "Bearer s3cret"}
	if code, _ := in.get(t, "/v1/explain?rule=api&key=bob"); code != 401 {
		t.Errorf("/v1/explain without the token: %d, want 401", code)
	}
	if code, _ := in.post(t, "/v1/explain/envoy", `{"domain":"edge"}`); code != 401 {
		t.Errorf("/v1/explain/envoy without the token: %d, want 401", code)
	}
	if err := in.redis(t, nil).Do(ctx, "FG.EXPLAIN", "api", "bob").Err(); err == nil || !strings.HasPrefix(err.Error(), "NOAUTH") {
		t.Errorf("FG.EXPLAIN without AUTH: %v, want NOAUTH", err)
	}

	// One an hour: the second check is denied by Redis, and cached.
	for range 2 {
		in.post(t, "/v1/check", `{"rule":"api","key":"bob"}`, auth...)
	}
	// The denial cache answers once the store hears Redis's lifts, which
	// it subscribes to at start: ask until the second denial is cached.
	var e map[string]any
	for deadline := time.Now().Add(10 * time.Second); ; {
		code, body := in.get(t, "/v1/explain?rule=api&key=bob", auth...)
		if code != 200 {
			t.Fatalf("/v1/explain: %d %v", code, body)
		}
		if e = body; e["store"].(map[string]any)["denial_cached"] == true || time.Now().After(deadline) {
			break
		}
		in.post(t, "/v1/check", `{"rule":"api","key":"bob"}`, auth...)
		time.Sleep(10 * time.Millisecond)
	}
	store := e["store"].(map[string]any)
	fb, _ := store["fallback"].(map[string]any)
	if e["allowed"] != false || store["name"] != "redis" || store["source"] != "store" || store["denial_cached"] != true || fb == nil || fb["mode"] != "local" || fb["share"] != "1/4" || fb["degraded"] != false {
		t.Errorf("explanation: %v", e)
	}
	lines, err := in.redis(t, &redis.Options{Password: "s3cret"}).Do(ctx, "FG.EXPLAIN", "api", "bob").StringSlice()
	if err != nil {
		t.Fatal(err)
	}
	why := strings.Join(lines, "\n")
	for _, want := range []string{"would be denied by limit 0", "Redis answers, shared by every instance", "1/4 of each limit", "caches a denial of the key"} {
		if !strings.Contains(why, want) {
			t.Errorf("FG.EXPLAIN lacks %q:\n%s", want, why)
		}
	}

	const envoyReq = `{"domain":"edge","descriptors":[{"entries":[{"key":"path","value":"/login"},{"key":"remote_address","value":"198.51.100.7"}]}]}`
	if code, _ := in.post(t, "/json", envoyReq, auth...); code != 200 {
		t.Fatalf("/json: %d", code)
	}
	code, body := in.post(t, "/v1/explain/envoy", envoyReq, auth...)
	if code != 200 || body["overall_code"] != "OVER_LIMIT" {
		t.Fatalf("/v1/explain/envoy: %d %v", code, body)
	}
	d := body["descriptors"].([]any)[0].(map[string]any)
	if d["descriptor"] != "edge.path_/login.remote_address" || d["code"] != "OVER_LIMIT" || d["state"].(map[string]any)["remaining"] != 0.0 {
		t.Errorf("descriptor: %v", d)
	}
	if code, _ := in.post(t, "/json", envoyReq, auth...); code != 429 {
		t.Errorf("/json after the explanation: %d, want 429 as explained", code)
	}
}
