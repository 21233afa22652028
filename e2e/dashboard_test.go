package e2e

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/floodgate/floodgate/internal/testkit/redistest"
)

// browser returns the path of a Chromium to drive, or skips the test;
// with FLOODGATE_REQUIRE_BROWSER set (the test command sets it in CI), a
// missing browser fails it.
func browser(t *testing.T) string {
	t.Helper()
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	if os.Getenv("FLOODGATE_REQUIRE_BROWSER") != "" {
		t.Fatal("no Chromium found (apt-get install chromium); FLOODGATE_REQUIRE_BROWSER is set")
	}
	t.Skip("no Chromium found (apt-get install chromium)")
	return ""
}

// artifacts returns the directory for the test's screenshots:
// $FLOODGATE_ARTIFACTS (the test command sets it), or a temporary one.
func artifacts(t *testing.T) string {
	dir := os.Getenv("FLOODGATE_ARTIFACTS")
	if dir == "" {
		return t.TempDir()
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	return dir
}

// TestDashboard opens the dashboard in headless Chromium, as a user
// would: gives the token, sends traffic that is denied, and checks that
// the chart moves, that the denied key is in the top-keys table, and that
// stopping the redis-server behind --redis shows the fallback.
func TestDashboard(t *testing.T) {
	chrome := browser(t)
	out := artifacts(t)
	srv := redistest.Start(t)
	// The built-in rule (config.ExampleYAML), and an Envoy domain beside it.
	rules := t.TempDir()
	for name, text := range map[string]string{"rules.yaml": "rules:\n  - name: example\n    algorithm: token-bucket\n    rate: 10\n    period: 1s\n    burst: 20\n",
		"edge.yaml": "domain: edge\ndescriptors:\n  - key: remote_address\n    rate_limit: {unit: hour, requests_per_unit: 1}\n",
		"llm.yaml":  "concurrency:\n  - {name: llm, slots: 2, lease: 60s}\n"} {
		if err := os.WriteFile(filepath.Join(rules, name), []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	in := serve(t, "--config", rules, "--redis", "redis://"+srv.Addr, "--token", "s3cret", "--budget", "20ms", "--ui-step", "250ms")

	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(chrome), chromedp.NoSandbox, chromedp.DisableGPU, chromedp.WindowSize(1300, 1100),
		chromedp.Flag("disable-quic", true), chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true), chromedp.Flag("disable-sync", true),
		chromedp.UserDataDir(t.TempDir()),
		// Chromium's singleton socket goes to a directory under TMPDIR,
		// which it does not remove when it is stopped: this test's own.
		chromedp.Env("TMPDIR="+t.TempDir()))
	actx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	defer cancelAlloc()
	ctx, cancel := chromedp.NewContext(actx)
	defer cancel()
	ctx, cancelTimeout := context.WithTimeout(ctx, 90*time.Second)
	defer cancelTimeout()

	shot := func(name string) {
		png, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
		if err != nil {
			t.Errorf("screenshot %s: %v", name, err)
			return
		}
		path := filepath.Join(out, name)
		if err := os.WriteFile(path, png, 0o644); err != nil {
			t.Error(err)
		}
		t.Logf("screenshot: %s", path)
	}
	// until evaluates js every 200ms until it is true, for at most 20s.
	until := func(what, js string) {
		t.Helper()
		for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline); {
			ok, err := chromedp.Run(ctx, chromedp.Evaluate[bool](js))
			if err != nil {
				t.Fatalf("%s: %v", what, err)
			}
			if ok {
				return
			}
			if err := chromedp.Do(ctx, chromedp.Sleep(200*time.Millisecond)); err != nil {
				t.Fatal(err)
			}
		}
		shot("dashboard-timeout.png")
		t.Fatalf("the page never showed %s", what)
	}
	post := func(path, body string) int {
		req, _ := http.NewRequest("POST", in.httpURL+path, strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Authorization", "Bearer s3cret")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	check := func(key string) int { return post("/v1/check", fmt.Sprintf(`{"rule":"example","key":%q}`, key)) }

	// The page asks for the token once.
	if err := chromedp.Do(ctx,
		chromedp.Navigate(in.httpURL+"/"),
		chromedp.WaitVisible("#token"),
		chromedp.SendKeys("#token", "s3cret"),
		chromedp.Click("#token-form button"),
		chromedp.WaitVisible("#main"),
	); err != nil {
		t.Fatal(err)
	}
	// Traffic for three seconds: the example rule admits 10/s with bursts
	// of 20, so most of the abuser's requests are denied.
	for round := range 12 {
		for range 10 + 3*(round%4) {
			check("abuser")
		}
		for i := range 2 + round%3 {
			check(fmt.Sprintf("user:%d", i))
		}
		check(fmt.Sprintf("scraper:%d", round%2))
		if err := chromedp.Do(ctx, chromedp.Sleep(250*time.Millisecond)); err != nil {
			t.Fatal(err)
		}
	}
	until("denials on the chart", `Number(document.getElementById("chart").dataset.denied) > 0`)
	until("the denied key in the top keys", `[...document.querySelectorAll("#top .top-key .key")].some(td => td.textContent === "abuser")`)
	// An Envoy request over its limit, over /json: its descriptor is in the
	// top keys under its domain, and the domain beside the rules.
	for i, want := range []int{http.StatusOK, http.StatusTooManyRequests} {
		if code := post("/json", `{"domain":"edge","descriptors":[{"entries":[{"key":"remote_address","value":"203.0.113.7"}]}]}`); code != want {
			t.Fatalf("Envoy request %d over /json: %d, want %d", i, code, want)
		}
	}
	until("the Envoy denial in the top keys", `[...document.querySelectorAll("#top .top-key")].some(tr => tr.cells[0].textContent === "envoy:edge" && tr.cells[1].textContent === "remote_address=203.0.113.7")`)
	until("the Envoy domain", `!document.getElementById("domains-section").hidden && [...document.querySelectorAll("#domains .domain")].some(tr => tr.cells[0].textContent === "edge" && tr.cells[1].textContent === "1")`)
	if err := chromedp.Do(ctx, chromedp.SendKeys("#inspect-key", "abuser"), chromedp.Click("#inspect button")); err != nil {
		t.Fatal(err)
	}
	// "Inspect a key" explains it: the limit that decides, in the table,
	// and who answers, in sentences (Redis, or on a machine so loaded that
	// it took more than the 20ms budget, the fallback).
	until("the inspected key", `document.getElementById("inspect-out").textContent.includes("of 20")`)
	until("the explanation", `!document.getElementById("inspect-limits").hidden && document.querySelector("#inspect-limits tr.decides") !== null &&
		document.getElementById("inspect-out").textContent.includes('key "abuser" is checked against rule "example"') &&
		/Redis answers, shared by every instance|Redis is failing for this key/.test(document.getElementById("inspect-out").textContent)`)
	// A concurrency rule: the key that acquired is among its holders, with
	// its slots held, and the rule can be inspected.
	for range 2 {
		if code := post("/v1/acquire", `{"rule":"llm","key":"streamer"}`); code != http.StatusOK {
			t.Fatalf("acquire: %d", code)
		}
	}
	until("the holder", `!document.getElementById("slots-section").hidden && [...document.querySelectorAll("#slots .holder")].some(tr => tr.cells[1].textContent === "streamer" && tr.cells[2].textContent === "2" && tr.cells[3].textContent === "2 of 2")`)
	if err := chromedp.Do(ctx, chromedp.SetValue("#inspect-rule", "llm"), chromedp.SetValue("#inspect-key", "streamer"), chromedp.Click("#inspect button")); err != nil {
		t.Fatal(err)
	}
	until("the concurrency rule's explanation", `document.getElementById("inspect-limits").hidden && document.getElementById("inspect-out").textContent.includes("2 of 2 slots are held now")`)
	if err := chromedp.Do(ctx, chromedp.SetValue("#inspect-rule", "example"), chromedp.SetValue("#inspect-key", "abuser")); err != nil {
		t.Fatal(err)
	}
	until("Redis's policy", `document.getElementById("redis-policy").textContent === "noeviction" && document.getElementById("redis-warning").hidden`)
	shot("dashboard.png")

	// Redis goes away: decisions fail over to the local limiter, and the
	// page shows it, on the badge and in the switches.
	srv.Stop()
	for range 10 {
		check("after-redis")
	}
	until("the fallback", `document.getElementById("store-state").dataset.state === "degraded" && document.querySelector("#events .event[data-state=degraded]") !== null`)
	// The explanation says the fallback answers now, with its share.
	if err := chromedp.Do(ctx, chromedp.SetValue("#inspect-key", "after-redis"), chromedp.Click("#inspect button")); err != nil {
		t.Fatal(err)
	}
	until("the fallback in the explanation", `document.getElementById("inspect-out").textContent.includes("Redis is failing for this key: the fallback answers, a local limiter with 1/1 of each limit")`)
	shot("dashboard-fallback.png")
}
