package httpapi_test

import (
	"encoding/json"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/floodgate/floodgate/internal/server/config"
	"github.com/floodgate/floodgate/internal/server/httpapi"
)

// utf8Handler serves the built-in rule "example" and the Envoy domain
// "web".
func utf8Handler(t *testing.T) http.Handler {
	t.Helper()
	dir := t.TempDir()
	for name, s := range map[string]string{
		"rules.yaml": config.ExampleYAML,
		"web.yaml":   "domain: web\ndescriptors:\n  - key: ip\n    rate_limit: {unit: hour, requests_per_unit: 100}\n",
	} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	cfg, err := config.Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	svc := envoyOn(t, cfg, nil)
	return httpapi.Handler(svc.Rules(), &httpapi.Options{Logger: slog.New(slog.DiscardHandler), Envoy: svc.JSONHandler(slog.New(slog.DiscardHandler))})
}

// TestInvalidUTF8 sends, on every endpoint that reads a JSON body, a
// string that is not UTF-8 text: raw bytes that are not UTF-8, or an
// escaped half of a surrogate pair. encoding/json would read each as
// U+FFFD, so that "x\xffy", "x\xfey" and "x\ufffdy" would share a bucket;
// each gets 400 instead, and UTF-8 text (U+FFFD itself included) passes.
func TestInvalidUTF8(t *testing.T) {
	endpoints := []struct {
		name, method, path string
		body               string // %s: the string under test, as JSON writes it
		ok                 int
		skip               string // a string case that does not apply
	}{
		{"check", "POST", "/v1/check", `{"rule":"example","key":"%s"}`, 200, ""},
		{"batch", "POST", "/v1/check/batch", `{"checks":[{"rule":"example","key":"a"},{"rule":"example","key":"%s"}]}`, 200, ""},
		{"reset", "POST", "/v1/reset", `{"rule":"example","key":"%s"}`, 204, ""},
		{"settle", "POST", "/v1/settle", `{"rule":"example","key":"%s","charged":2,"cost":1}`, 200, ""},
		{"envoy json", "POST", "/json", `{"domain":"web","descriptors":[{"entries":[{"key":"ip","value":"%s"}]}]}`, 200, ""},
		{"override", "PUT", "/v1/overrides/example/k", `{"algorithm":"fixed-window","limit":5,"window":"1m","name":"%s"}`, 200,
			// The override is read as YAML, which has no surrogate
			// pairs (it writes \U0001f600): a 400 of its own.
			"a surrogate pair"},
	}
	strs := []struct {
		name, s string
		bad     string // in the 400's detail; "" when the string passes
	}{
		{"ascii", "xy", ""},
		{"U+FFFD escaped", `x\ufffdy`, ""},
		{"U+FFFD as UTF-8", "x\uFFFDy", ""},
		{"a surrogate pair", `x\ud83d\ude00y`, ""},
		{"an escaped backslash before u", `x\\ud800y`, ""},
		{"byte 0xff", "x\xffy", "not valid UTF-8 (byte "},
		{"byte 0xfe", "x\xfey", "not valid UTF-8 (byte "},
		{"a truncated sequence", "x\xe2\x82y", "not valid UTF-8 (byte "},
		{"an encoded surrogate", "x\xed\xa0\x80y", "not valid UTF-8 (byte "},
		{"a lone high surrogate", `x\ud800y`, `\ud800 at byte `},
		{"a lone low surrogate", `x\uDC00y`, `\uDC00 at byte `},
		{"a high surrogate at the end", `x\ud83d`, `\ud83d at byte `},
		{"two high surrogates", `x\ud83d\ud83dy`, `\ud83d at byte `},
	}
	for _, ep := range endpoints {
		for _, s := range strs {
			if s.name == ep.skip {
				continue
			}
			t.Run(ep.name+"/"+s.name, func(t *testing.T) {
				h := utf8Handler(t)
				body := strings.Replace(ep.body, "%s", s.s, 1)
				req := httptest.NewRequest(ep.method, ep.path, strings.NewReader(body))
				req.Header.Set("Content-Type", "application/json")
				rec := httptest.NewRecorder()
				h.ServeHTTP(rec, req)
				if s.bad == "" {
					if rec.Code != ep.ok {
						t.Fatalf("%s: %d %s, want %d", body, rec.Code, rec.Body, ep.ok)
					}
					return
				}
				var p struct{ Detail string }
				json.Unmarshal(rec.Body.Bytes(), &p)
				if rec.Code != 400 || !strings.Contains(p.Detail, s.bad) || rec.Header().Get("Content-Type") != "application/problem+json" {
					t.Fatalf("%q: %d %s, want 400 saying %q", body, rec.Code, rec.Body, s.bad)
				}
			})
		}
	}
}

// TestInvalidUTF8KeysApart checks what the refusal is for: after checks
// of "x\xffy" and "x\xfey", refused, the key "x\ufffdy" is fresh.
func TestInvalidUTF8KeysApart(t *testing.T) {
	h := utf8Handler(t)
	check := func(key string) (int, map[string]any) {
		req := httptest.NewRequest("POST", "/v1/check", strings.NewReader(`{"rule":"example","key":"`+key+`","cost":5}`))
		req.Header.Set("Content-Type", "application/json")
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		var m map[string]any
		json.Unmarshal(rec.Body.Bytes(), &m)
		return rec.Code, m
	}
	for _, key := range []string{"x\xffy", "x\xfey", `x\udfffy`} {
		if code, m := check(key); code != 400 {
			t.Errorf("check of %q: %d %v, want 400", key, code, m)
		}
	}
	if code, m := check(`x\ufffdy`); code != 200 || m["remaining"] != 15.0 {
		t.Errorf("check of x\\ufffdy: %d %v, want 200 with 15 of 20 left", code, m)
	}
}
