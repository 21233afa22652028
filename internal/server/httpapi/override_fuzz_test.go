package httpapi_test

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"net/url"
	"slices"
	"strings"
	"testing"

	"github.com/floodgate/floodgate"
	"github.com/floodgate/floodgate/internal/server/config"
	"github.com/floodgate/floodgate/internal/server/httpapi"
	"github.com/floodgate/floodgate/internal/testkit/redistest"
	"github.com/floodgate/floodgate/redisstore"
	"github.com/redis/go-redis/v9"
)

// fuzzOverrideRules are the rules FuzzOverrideAPI overrides keys of: a
// bucket, and the largest sliding log, so that an override carries a
// log's usage too.
const fuzzOverrideRules = `rules:
  - {name: bucket, algorithm: token-bucket, rate: 10, period: 1s, burst: 20}
  - {name: logs, algorithm: sliding-log, limit: 250, window: 24h}
`

// FuzzOverrideAPI sends arbitrary override bodies to PUT
// /v1/overrides/{rule}/{key} on a Redis store, then checks, settles and
// deletes the override with costs of any size: every answer must be one
// of the API's statuses with a JSON body (none a 5xx), an override
// accepted must read back, and no request may cost Redis unbounded work.
// That is checked at every step by what a request writes (no sorted set,
// a sliding log's units, beyond twice MaxLogQuota) and by SLOWLOG (no
// script call of 50ms or more: far above the bounded scripts' fraction of
// a millisecond, far below the seconds an unbounded log took). Run it as
//
//	go test -run '^$' -fuzz '^FuzzOverrideAPI$' -fuzztime 20000x ./internal/server/httpapi
func FuzzOverrideAPI(f *testing.F) {
	f.Add("logs", "k", []byte(`{"algorithm":"sliding-log","limit":5000000,"window":"24h"}`), int64(1000000), byte(0))
	f.Add("logs", "k", []byte(`{"algorithm":"sliding-log","limit":100000000,"window":"24h"}`), int64(50000000), byte(1))
	f.Add("logs", "k", []byte(`{"algorithm":"sliding-log","limit":250,"window":"12h","strategy":"as-is"}`), int64(1)<<40, byte(2))
	f.Add("bucket", "k", []byte(`{"limits":[{"algorithm":"sliding-log","limit":200,"window":"1s"},{"algorithm":"sliding-log","limit":50,"window":"1h"}],"strategy":"proportional","ttl":"1h"}`), int64(250), byte(3))
	f.Add("bucket", "k", []byte(`{"limits":[{"algorithm":"sliding-log","limit":200,"window":"1s"},{"algorithm":"sliding-log","limit":200,"window":"1h"}]}`), int64(7), byte(0))
	f.Add("logs", "a/b", []byte("algorithm: sliding-window\nlimit: 100000000\nwindow: 24h\nstrategy: reset\n"), int64(-1), byte(1))
	f.Add("nope", "k", []byte(`{"algorithm":"gcra","max_burst":9,"count":10,"period":"1s"}`), int64(0), byte(2))
	f.Add("logs", "k", []byte(`{`), int64(3), byte(3))

	srv := redistest.Start(f)
	client, admin := srv.Client(f), srv.Admin(f)
	ctx := context.Background()
	for _, kv := range [][2]string{{"slowlog-log-slower-than", "50000"}, {"slowlog-max-len", "16"}} {
		if err := admin.ConfigSet(ctx, kv[0], kv[1]).Err(); err != nil {
			f.Fatal(err)
		}
	}
	st := redisstore.New(client, &redisstore.Options{Prefix: "fz:"})
	f.Cleanup(func() { st.Close() })
	cfg, err := config.Parse("rules.yaml", []byte(fuzzOverrideRules))
	if err != nil {
		f.Fatal(err)
	}
	h := handlerOn(f, st, cfg, &httpapi.Options{})
	strategies := []string{"", "additive", "as-is", "proportional", "reset"}

	f.Fuzz(func(t *testing.T, rule, key string, body []byte, cost int64, op byte) {
		t.Cleanup(func() { admin.FlushAll(ctx) })
		item := "/v1/overrides/" + url.PathEscape(rule) + "/" + url.PathEscape(key)
		do := func(method, path string, body []byte, ok ...int) int {
			t.Helper()
			req, err := http.NewRequest(method, "http://floodgate"+path, bytes.NewReader(body))
			if err != nil {
				return 0 // not a request a client could send
			}
			req.Header.Set("Content-Type", "application/json")
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, req)
			code := rec.Code
			switch {
			case code == 301 || code == 307 || code == 308: // the mux cleans paths
			case !slices.Contains(ok, code):
				t.Fatalf("%s %s %q: status %d %s", method, path, body, code, rec.Body)
			case code != http.StatusNoContent && !json.Valid(rec.Body.Bytes()):
				t.Fatalf("%s %s: body is not JSON: %q", method, path, rec.Body)
			}
			bounded(t, admin, method+" "+path)
			return code
		}
		if do("PUT", item, body, 200, 400, 404, 413) != 200 {
			return
		}
		do("GET", item, nil, 200)
		cost = max(cost, 0)
		check, _ := json.Marshal(httpapi.CheckRequest{Rule: rule, Key: key, Cost: &cost})
		do("POST", "/v1/check", check, 200, 429)
		settle, _ := json.Marshal(httpapi.SettleRequest{Rule: rule, Key: key, Charged: int64(op) % 3, Cost: cost})
		do("POST", "/v1/settle", settle, 200, 429)
		do("POST", "/v1/settle", settle, 200, 429)
		do("DELETE", item+"?strategy="+strategies[int(op)%len(strategies)], nil, 204)
		do("POST", "/v1/check", check, 200, 429)
	})
}

// bounded fails t when Redis holds a sorted set (a sliding log) of more
// than twice MaxLogQuota units and its clock member, or SLOWLOG holds a
// script call of 50ms or more; it empties SLOWLOG. client is the default
// user's (KEYS, SLOWLOG).
func bounded(t *testing.T, client *redis.Client, what string) {
	t.Helper()
	ctx := context.Background()
	keys, err := client.Keys(ctx, "*").Result()
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range keys {
		if client.Type(ctx, k).Val() != "zset" {
			continue
		}
		if n := client.ZCard(ctx, k).Val(); n > 2*floodgate.MaxLogQuota+1 {
			t.Fatalf("after %s, %s holds %d members, more than twice MaxLogQuota", what, k, n)
		}
	}
	for _, l := range client.SlowLogGet(ctx, -1).Val() {
		if len(l.Args) > 0 && slices.Contains([]string{"evalsha", "eval", "fcall", "fcall_ro"}, strings.ToLower(l.Args[0])) {
			t.Fatalf("after %s, SLOWLOG holds a script call of %v", what, l.Duration)
		}
	}
	client.SlowLogReset(ctx)
}
