package main

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/floodgate/floodgate"
	"github.com/floodgate/floodgate/internal/testkit/redistest"
	"github.com/floodgate/floodgate/storetest"
	"github.com/redis/go-redis/v9"
)

// The chaos run: floodgate serve on a standalone Redis, a Cluster and a
// Sentinel deployment, started here on loopback ports, under a bounded
// load, with each fault applied in turn. For each it measures the callers'
// errors, what was admitted against what an exact limiter admits on the
// same arrivals, the largest over-admission at any moment, and how long
// after the fault was healed decisions came from Redis again.
//
// The test command runs the short form and asserts the bounds; the full
// form, with longer faults, prints docs/fallback.md's table:
//
//	go test -run Chaos -v ./cmd/floodgate -args -chaos.full
var chaosFull = flag.Bool("chaos.full", false, "run the chaos test at full length and print its table")

// chaosCallers is how many callers post decisions on the key; the bound
// on over-admission is this many per outage (docs/fallback.md,
// "No double admission").
const chaosCallers = 4

// chaosLimit is the rule's limit: 100 per second, bursts of 100.
var chaosLimit = floodgate.TokenBucket(100, time.Second, 100)

// deployment is the Redis that a fault breaks.
type deployment struct {
	url      string
	srv      *redistest.Server // standalone
	cluster  *redistest.Cluster
	sentinel *redistest.Sentinel
	admin    *redis.Client // to the standalone server
}

type chaosFault struct {
	deploy string
	name   string
	// outages is how many times the fault takes Redis away.
	outages int
	// apply breaks Redis and heals it, and returns when it was healed.
	apply func(t *testing.T, d *deployment, hold time.Duration) time.Time
}

func chaosFaults() []chaosFault {
	return []chaosFault{
		{"standalone", "SIGKILL, then restart", 1, func(t *testing.T, d *deployment, hold time.Duration) time.Time {
			d.srv.Kill()
			time.Sleep(hold)
			d.srv.Restart(t) // returns once it answers PING
			return time.Now()
		}},
		{"standalone", "SIGSTOP, then SIGCONT", 1, func(t *testing.T, d *deployment, hold time.Duration) time.Time {
			mustDo(t, d.srv.Signal(syscall.SIGSTOP))
			time.Sleep(hold)
			mustDo(t, d.srv.Signal(syscall.SIGCONT))
			return time.Now()
		}},
		{"standalone", "80ms stall every 400ms, 6 times", 6, func(t *testing.T, d *deployment, hold time.Duration) time.Time {
			for range 6 {
				time.Sleep(320 * time.Millisecond)
				mustDo(t, d.srv.Signal(syscall.SIGSTOP))
				time.Sleep(80 * time.Millisecond)
				mustDo(t, d.srv.Signal(syscall.SIGCONT))
			}
			return time.Now()
		}},
		{"standalone", "SCRIPT FLUSH and FUNCTION FLUSH, 10 times", 0, func(t *testing.T, d *deployment, hold time.Duration) time.Time {
			ctx := context.Background()
			for range 10 {
				mustDo(t, d.admin.ScriptFlush(ctx).Err())
				mustDo(t, d.admin.FunctionFlush(ctx).Err())
				time.Sleep(hold / 10)
			}
			return time.Now()
		}},
		{"standalone", "maxmemory with noeviction", 1, func(t *testing.T, d *deployment, hold time.Duration) time.Time {
			ctx := context.Background()
			mustDo(t, d.admin.ConfigSet(ctx, "maxmemory-policy", "noeviction").Err())
			mustDo(t, d.admin.ConfigSet(ctx, "maxmemory", "1").Err()) // below what it uses: every write is refused
			time.Sleep(hold)
			mustDo(t, d.admin.ConfigSet(ctx, "maxmemory", "0").Err())
			return time.Now()
		}},
		{"cluster", "the key's master killed, then restarted", 1, func(t *testing.T, d *deployment, hold time.Duration) time.Time {
			cc := d.cluster.Client(t)
			node, err := cc.MasterForKey(context.Background(), "{r5:chaos:hot}")
			mustDo(t, err)
			i := slices.Index(d.cluster.Addrs, node.Options().Addr)
			d.cluster.Servers[i].Kill()
			time.Sleep(hold)
			d.cluster.Servers[i].Restart(t)
			return time.Now()
		}},
		{"sentinel", "SENTINEL FAILOVER, then SIGKILL of the old master", 1, func(t *testing.T, d *deployment, hold time.Duration) time.Time {
			d.sentinel.Failover(t)
			healed := time.Now()
			d.sentinel.Master.Kill()
			return healed
		}},
	}
}

func mustDo(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func deploy(t *testing.T, kind string) *deployment {
	switch kind {
	case "cluster":
		c := redistest.StartCluster(t, 3)
		return &deployment{cluster: c, url: c.URL()}
	case "sentinel":
		s := redistest.StartSentinel(t)
		return &deployment{sentinel: s, url: s.URL()}
	}
	srv := redistest.Start(t)
	return &deployment{srv: srv, admin: srv.Admin(t), url: srv.URL() + "/0"}
}

// chaosRow is one line of the table.
type chaosRow struct {
	deploy, fault     string
	errors            int
	admitted, exact   int
	largestOver       int
	back              time.Duration
	arrivals, outages int
	backOK, boundOK   bool
	backLimit         time.Duration
	overBound         int
	elapsed           time.Duration
	localDecisions    int
	firstError        string
}

func TestChaos(t *testing.T) {
	hold, warm, after := 300*time.Millisecond, 300*time.Millisecond, 700*time.Millisecond
	if *chaosFull {
		hold, warm, after = 2*time.Second, time.Second, 2*time.Second
	}
	rules := filepath.Join(t.TempDir(), "rules.yaml")
	writeFile(t, rules, "rules:\n  - name: chaos\n    algorithm: token-bucket\n    rate: 100\n    period: 1s\n    burst: 100\n")
	var rows []chaosRow
	for _, f := range chaosFaults() {
		t.Run(f.deploy+"/"+f.name, func(t *testing.T) {
			d := deploy(t, f.deploy)
			in := serve(t, "--redis", d.url, "--config", rules)
			row := runChaos(t, in, d, f, hold, warm, after)
			rows = append(rows, row)
			if row.errors != 0 {
				t.Errorf("callers saw %d errors; the first: %s", row.errors, row.firstError)
			}
			if !row.boundOK {
				t.Errorf("largest over-admission %d, more than the bound of %d callers per outage (%d)", row.largestOver, chaosCallers, row.overBound)
			}
			if !row.backOK {
				t.Errorf("decisions came from Redis again %s after the fault was healed, want within %s", row.back, row.backLimit)
			}
		})
	}
	var b bytes.Buffer
	fmt.Fprintf(&b, "| Deployment | Fault | Caller errors | Admitted / exact | Largest over-admission | Back on Redis after healing |\n")
	fmt.Fprintf(&b, "|---|---|---|---|---|---|\n")
	for _, r := range rows {
		back := r.back.Round(time.Millisecond).String()
		if r.back < 0 {
			back = "never left"
		}
		fmt.Fprintf(&b, "| %s | %s | %d | %d / %d | %d | %s |\n", r.deploy, r.fault, r.errors, r.admitted, r.exact, r.largestOver, back)
	}
	t.Logf("chaos table (%d callers on one key of 100/s, burst 100):\n%s", chaosCallers, b.String())
	if *chaosFull {
		fmt.Print(b.String())
	}
}

// runChaos runs the load on in, applies f, and measures.
func runChaos(t *testing.T, in *instance, d *deployment, f chaosFault, hold, warm, after time.Duration) chaosRow {
	client := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: chaosCallers}}
	defer client.CloseIdleConnections()
	load := storetest.StartLoad(chaosCallers, 4*time.Millisecond, func() (floodgate.Result, error) {
		return chaosCheck(client, in.httpURL)
	})
	time.Sleep(warm)
	broken := time.Now()
	healed := f.apply(t, d, hold)
	backLimit := time.Second
	if f.deploy == "cluster" {
		backLimit = 10 * time.Second // the Cluster clears the node's failure flag first
	}
	// Go on until Redis decides again (within the limit), and then a while.
	for time.Since(healed) < backLimit {
		if a, ok := load.Last(); ok && a.Result.Source == floodgate.SourceStore && a.At.After(healed) {
			break
		}
		time.Sleep(5 * time.Millisecond)
	}
	time.Sleep(after)
	arrivals, errs := load.Stop()

	row := chaosRow{deploy: f.deploy, fault: f.name, errors: len(errs), arrivals: len(arrivals), outages: f.outages, backLimit: backLimit}
	if len(errs) > 0 {
		row.firstError = errs[0].Error()
	}
	var err error
	row.admitted, row.exact, row.largestOver, err = storetest.Compare(arrivals, "hot", chaosLimit)
	mustDo(t, err)
	// Back on Redis: from healing to Redis's first decision after it, if
	// the fault took decisions away from Redis at all (-1 if not). A
	// decision made locally later on (a caller that waited past the
	// budget on a loaded machine, after Redis was back) does not make
	// Redis's earlier decisions count for nothing: until then, a run whose
	// only local decisions came after them read "never back" (a CI run
	// saw 6 such, and Redis deciding all along).
	row.back = -1
	for _, a := range arrivals {
		store := a.Result.Source == floodgate.SourceStore
		if a.At.After(broken) && !store {
			row.localDecisions++
		}
		if row.back < 0 && store && a.At.After(healed) {
			row.back = a.At.Sub(healed)
		}
	}
	if row.localDecisions == 0 {
		row.back = -1
	}
	row.elapsed = arrivals[len(arrivals)-1].At.Sub(arrivals[0].At)
	row.overBound = chaosCallers * (f.outages + 1)
	row.boundOK = row.largestOver <= row.overBound
	row.backOK = row.back < row.backLimit
	if row.back < 0 && row.localDecisions > 0 {
		row.backOK, row.back = false, time.Since(healed) // never back
	}
	t.Logf("%s, %s: %d arrivals in %s, %d errors, admitted %d, exact %d, largest over-admission %d, %d local decisions, back on Redis %s after healing",
		f.deploy, f.name, row.arrivals, row.elapsed.Round(time.Millisecond), row.errors, row.admitted, row.exact, row.largestOver, row.localDecisions, row.back.Round(time.Millisecond))
	if os.Getenv("CHAOS_STDERR") != "" {
		t.Logf("serve's log:\n%s", in.stderr)
	}
	return row
}

// chaosCheck asks serve at url for one decision on the chaos rule's key.
func chaosCheck(client *http.Client, url string) (floodgate.Result, error) {
	resp, err := client.Post(url+"/v1/check", "application/json", strings.NewReader(`{"rule":"chaos","key":"hot"}`))
	if err != nil {
		return floodgate.Result{}, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 && resp.StatusCode != 429 {
		return floodgate.Result{}, fmt.Errorf("status %d", resp.StatusCode)
	}
	var body struct {
		Allowed bool   `json:"allowed"`
		Source  string `json:"source"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&body); err != nil {
		return floodgate.Result{}, err
	}
	r := floodgate.Result{Allowed: body.Allowed, Source: floodgate.SourceLocal}
	if body.Source == "store" {
		r.Source = floodgate.SourceStore
	}
	return r, nil
}
