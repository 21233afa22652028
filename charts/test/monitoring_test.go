package charttest

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/floodgate/floodgate/internal/testkit/redistest"
	"github.com/floodgate/floodgate/internal/testkit/servetest"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	plabels "github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/model/rulefmt"
	"github.com/prometheus/prometheus/promql/parser"
	"github.com/redis/go-redis/v9"
)

// The alerts and the dashboard: their one copy is in the chart, and
// deploy/ holds byte-for-byte copies for those who use no Helm.
const (
	alertsFile    = chartDir + "/files/alerts.yaml"
	dashboardFile = chartDir + "/files/grafana.json"
	// runbooks is where each alert's runbook_url points, at the anchor of
	// its name.
	runbooks = "https://github.com/floodgate/floodgate/blob/main/docs/operations.md#"
)

// deployCopies maps each deploy/ copy to the chart's file it copies.
var deployCopies = map[string]string{
	"../../deploy/prometheus/alerts.yaml": alertsFile,
	"../../deploy/grafana/floodgate.json": dashboardFile,
}

// wantAlerts are the alerts the file must have (issue 58).
var wantAlerts = []string{
	"FloodgateDown", "FloodgateInstanceDown", "FloodgateFallbackAnswering", "FloodgateDecisionErrors",
	"FloodgateKeyErrors", "FloodgateRulesReloadFailed", "FloodgateRedisEvicting", "FloodgateRedisRestarted",
}

// wantRows are the dashboard's rows, in order.
var wantRows = []string{"Traffic", "Denials", "Latency", "Fallback", "Redis health", "Memory store", "Envoy"}

// promql parses as Prometheus does by default.
var promql = parser.NewParser(parser.Options{})

func TestDeployCopies(t *testing.T) {
	for cp, src := range deployCopies {
		a, err := os.ReadFile(cp)
		if err != nil {
			t.Fatal(err)
		}
		b, err := os.ReadFile(src)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(a, b) {
			t.Errorf("%s differs from %s, its source: cp %s %s (from charts/test)", cp, src, src, cp)
		}
	}
}

// rulesFile is the alerts file as Prometheus reads it.
type rulesFile struct {
	Groups []ruleGroup `json:"groups"`
}

type ruleGroup struct {
	Name  string `json:"name"`
	Rules []rule `json:"rules"`
}

type rule struct {
	Alert       string            `json:"alert"`
	Expr        string            `json:"expr"`
	For         string            `json:"for,omitempty"`
	Labels      map[string]string `json:"labels"`
	Annotations map[string]string `json:"annotations"`
}

func readAlerts(t *testing.T) ([]byte, *rulesFile) {
	t.Helper()
	b, err := os.ReadFile(alertsFile)
	if err != nil {
		t.Fatal(err)
	}
	var f rulesFile
	if err := decodeStrict(string(b), &f); err != nil {
		t.Fatalf("%s: %v", alertsFile, err)
	}
	return b, &f
}

// TestAlertRules loads the alerts as Prometheus does (promtool check
// rules: expressions, durations, label names and annotation templates) and
// checks what Prometheus does not: each alert's severity, annotations,
// runbook and job.
func TestAlertRules(t *testing.T) {
	b, f := readAlerts(t)
	if _, errs := rulefmt.Parse(b, false, model.UTF8Validation, promql, slog.New(slog.DiscardHandler)); len(errs) > 0 {
		t.Fatalf("Prometheus refuses %s: %v", alertsFile, errs)
	}
	var alerts []string
	for _, g := range f.Groups {
		for _, r := range g.Rules {
			alerts = append(alerts, r.Alert)
			if !slices.Contains([]string{"critical", "warning", "info"}, r.Labels["severity"]) {
				t.Errorf("%s: severity %q, want critical, warning or info", r.Alert, r.Labels["severity"])
			}
			for _, a := range []string{"summary", "description"} {
				if strings.TrimSpace(r.Annotations[a]) == "" {
					t.Errorf("%s: no %s", r.Alert, a)
				}
			}
			if want := runbooks + strings.ToLower(r.Alert); r.Annotations["runbook_url"] != want {
				t.Errorf("%s: runbook_url %q, want %q (docs/operations.md's heading ### %s)", r.Alert, r.Annotations["runbook_url"], want, r.Alert)
			}
			// The chart scopes the rules to its release by replacing
			// job="floodgate": a selector without it would see every
			// release's series.
			expr, err := promql.ParseExpr(r.Expr)
			if err != nil {
				t.Errorf("%s: %v", r.Alert, err)
				continue
			}
			for _, vs := range selectors(expr) {
				if !slices.ContainsFunc(vs.LabelMatchers, func(m *plabels.Matcher) bool {
					return m.Name == "job" && m.Value == "floodgate" && m.Type == plabels.MatchEqual
				}) {
					t.Errorf("%s: %s does not select job=\"floodgate\"", r.Alert, vs)
				}
			}
		}
	}
	for _, a := range wantAlerts {
		if !slices.Contains(alerts, a) {
			t.Errorf("alert %s missing: %v", a, alerts)
		}
	}
	if i := slices.IndexFunc(alerts, func(a string) bool { return slices.Contains(alerts[slices.Index(alerts, a)+1:], a) }); i >= 0 {
		t.Errorf("alert %s twice", alerts[i])
	}
}

// chartRules returns the rules the chart's PrometheusRule must hold: the
// file's, on job.
func chartRules(t *testing.T, job string) []ruleGroup {
	t.Helper()
	b, _ := readAlerts(t)
	var f rulesFile
	s := strings.ReplaceAll(string(b), `job="floodgate"`, fmt.Sprintf("job=%q", job))
	if err := decodeStrict(s, &f); err != nil {
		t.Fatal(err)
	}
	return f.Groups
}

// dashboard is the part of a Grafana dashboard the test reads.
type dashboard struct {
	Title      string
	UID        string
	Panels     []panel
	Templating struct {
		List []struct {
			Name       string
			Type       string
			Query      any
			Datasource *datasource
		}
	}
}

type panel struct {
	ID         int
	Type       string
	Title      string
	Datasource *datasource
	GridPos    struct{ H, W, X, Y int }
	Panels     []panel // a collapsed row's
	Targets    []struct {
		RefID      string `json:"refId"`
		Expr       string
		Datasource *datasource
	}
}

type datasource struct{ Type, UID string }

func readDashboard(t *testing.T) *dashboard {
	t.Helper()
	b, err := os.ReadFile(dashboardFile)
	if err != nil {
		t.Fatal(err)
	}
	var d dashboard
	if err := json.Unmarshal(b, &d); err != nil {
		t.Fatalf("%s: %v", dashboardFile, err)
	}
	return &d
}

// grafanaVar is a variable in a Grafana query: $name, ${name},
// ${name:format} or [[name]].
var grafanaVar = regexp.MustCompile(`\$\{(\w+)(?::\w+)?\}|\$(\w+)|\[\[(\w+)\]\]`)

// grafanaBuiltins are Grafana's own variables, with a value of their kind.
var grafanaBuiltins = map[string]string{"__rate_interval": "5m", "__interval": "1m", "__range": "1h", "__range_s": "3600", "__interval_ms": "60000"}

// expand replaces the Grafana variables in q with values PromQL parses: a
// builtin's by a value of its kind, the dashboard's by "x" (they are only
// in label values). A variable the dashboard does not define is an error:
// Grafana would send it as it is.
func expand(q string, defined []string) (string, error) {
	var err error
	out := grafanaVar.ReplaceAllStringFunc(q, func(m string) string {
		s := grafanaVar.FindStringSubmatch(m)
		name := s[1] + s[2] + s[3]
		if v, ok := grafanaBuiltins[name]; ok {
			return v
		}
		if !slices.Contains(defined, name) {
			err = fmt.Errorf("$%s is not a variable of the dashboard", name)
		}
		return "x"
	})
	return out, err
}

// dashboardExprs returns every PromQL expression of the dashboard, its
// variables expanded, by where it is; the variables' label_values queries
// give their series selector.
func dashboardExprs(t *testing.T, d *dashboard) map[string]string {
	t.Helper()
	var vars []string
	for _, v := range d.Templating.List {
		vars = append(vars, v.Name)
	}
	out := map[string]string{}
	add := func(where, q string) {
		e, err := expand(q, vars)
		if err != nil {
			t.Errorf("%s: %v", where, err)
		}
		out[where] = e
	}
	labelValues := regexp.MustCompile(`^label_values\((.*),\s*\w+\)$`)
	for _, v := range d.Templating.List {
		if v.Type != "query" {
			continue
		}
		q, _ := v.Query.(map[string]any)["query"].(string)
		m := labelValues.FindStringSubmatch(q)
		if m == nil {
			t.Errorf("variable %s: query %q, want label_values(selector, label)", v.Name, q)
			continue
		}
		add("variable "+v.Name, m[1])
	}
	for _, p := range allPanels(d.Panels) {
		for _, tg := range p.Targets {
			add(fmt.Sprintf("panel %q %s", p.Title, tg.RefID), tg.Expr)
		}
	}
	return out
}

func allPanels(ps []panel) []panel {
	var out []panel
	for _, p := range ps {
		out = append(out, p)
		out = append(out, allPanels(p.Panels)...)
	}
	return out
}

// TestDashboard checks the dashboard's structure: the data source is its
// variable everywhere (so that the sidecar's and the import's copies both
// work), the rows are there, the panels do not overlap, and every query
// parses as PromQL.
func TestDashboard(t *testing.T) {
	d := readDashboard(t)
	if d.Title == "" || d.UID == "" {
		t.Errorf("title %q, uid %q: want both", d.Title, d.UID)
	}
	vars := map[string]string{}
	for _, v := range d.Templating.List {
		vars[v.Name] = v.Type
		if v.Type == "query" && (v.Datasource == nil || v.Datasource.UID != "${DS_PROMETHEUS}") {
			t.Errorf("variable %s: data source %+v, want ${DS_PROMETHEUS}", v.Name, v.Datasource)
		}
	}
	for name, typ := range map[string]string{"DS_PROMETHEUS": "datasource", "instance": "query", "rule": "query"} {
		if vars[name] != typ {
			t.Errorf("variable %s is %q, want a %s variable", name, vars[name], typ)
		}
	}
	var rows []string
	ids := map[int]bool{}
	type cell struct{ x, y int }
	used := map[cell]string{}
	for _, p := range allPanels(d.Panels) {
		if ids[p.ID] {
			t.Errorf("panel id %d twice", p.ID)
		}
		ids[p.ID] = true
		g := p.GridPos
		if g.W < 1 || g.H < 1 || g.X < 0 || g.X+g.W > 24 {
			t.Errorf("panel %q at %+v: outside the 24 columns", p.Title, g)
		}
		for x := g.X; x < g.X+g.W; x++ {
			for y := g.Y; y < g.Y+g.H; y++ {
				if o, ok := used[cell{x, y}]; ok {
					t.Errorf("panel %q overlaps %q", p.Title, o)
				}
				used[cell{x, y}] = p.Title
			}
		}
		if p.Type == "row" {
			rows = append(rows, p.Title)
			continue
		}
		if p.Datasource == nil || p.Datasource.UID != "${DS_PROMETHEUS}" {
			t.Errorf("panel %q: data source %+v, want ${DS_PROMETHEUS}", p.Title, p.Datasource)
		}
		if len(p.Targets) == 0 {
			t.Errorf("panel %q has no query", p.Title)
		}
		for _, tg := range p.Targets {
			if tg.Datasource == nil || tg.Datasource.UID != "${DS_PROMETHEUS}" {
				t.Errorf("panel %q %s: data source %+v, want ${DS_PROMETHEUS}", p.Title, tg.RefID, tg.Datasource)
			}
		}
	}
	if !slices.Equal(rows, wantRows) {
		t.Errorf("rows %q, want %q", rows, wantRows)
	}
	for where, e := range dashboardExprs(t, d) {
		if _, err := promql.ParseExpr(e); err != nil {
			t.Errorf("%s: %q: %v", where, e, err)
		}
	}
}

// TestMetricNames checks that every metric and label the alerts and the
// dashboard name is one floodgate serve exports, asked of the binary
// built from this checkout, on the embedded store and on a redis-server,
// after requests that make every lazily made series appear: a renamed
// metric or label fails here rather than in a silent panel.
func TestMetricNames(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs floodgate serve")
	}
	bin := buildFloodgate(t)
	families := exported(t, bin, "")
	srv := redistest.Start(t)
	for name, f := range exported(t, bin, srv.Addr) {
		if have, ok := families[name]; ok && len(have.Metric) > 0 {
			continue // the embedded store's has its labels already
		}
		families[name] = f
	}

	exprs := dashboardExprs(t, readDashboard(t))
	_, f := readAlerts(t)
	for _, g := range f.Groups {
		for _, r := range g.Rules {
			exprs["alert "+r.Alert] = r.Expr
		}
	}
	shown := map[string]bool{}
	for where, e := range exprs {
		expr, err := promql.ParseExpr(e)
		if err != nil {
			t.Errorf("%s: %v", where, err)
			continue
		}
		checkNames(t, where, expr, families)
		if strings.HasPrefix(where, "panel ") {
			for _, vs := range selectors(expr) {
				shown[strings.TrimSuffix(strings.TrimSuffix(strings.TrimSuffix(vs.Name, "_bucket"), "_sum"), "_count")] = true
			}
		}
	}
	// And the other way: a metric serve gains gets a panel.
	for name := range families {
		if !shown[name] {
			t.Errorf("%s has no panel in %s", name, dashboardFile)
		}
	}
}

// selectors returns the series selectors of expr.
func selectors(expr parser.Expr) []*parser.VectorSelector {
	var out []*parser.VectorSelector
	parser.Inspect(expr, func(n parser.Node, _ []parser.Node) error {
		if vs, ok := n.(*parser.VectorSelector); ok {
			out = append(out, vs)
		}
		return nil
	})
	return out
}

// targetLabels are the labels Prometheus adds to every series it scrapes,
// and those Kubernetes service discovery adds through the Prometheus
// Operator's relabelling.
var targetLabels = []string{"job", "instance", "namespace", "pod", "service", "container", "endpoint"}

// family returns the metric family a series name belongs to, and the
// labels its series have: a histogram's _bucket, _sum and _count belong
// to the histogram. Prometheus's own up has only the target's labels.
func family(name string, families map[string]*dto.MetricFamily) (labels []string, ok bool) {
	labels = append([]string(nil), targetLabels...)
	if name == "up" {
		return labels, true
	}
	f, ok := families[name]
	if !ok {
		for _, suffix := range []string{"_bucket", "_sum", "_count"} {
			base, cut := strings.CutSuffix(name, suffix)
			if h, found := families[base]; cut && found && h.GetType() == dto.MetricType_HISTOGRAM {
				f, ok = h, true
				if suffix == "_bucket" {
					labels = append(labels, "le")
				}
			}
		}
	}
	if !ok {
		return nil, false
	}
	for _, m := range f.Metric {
		for _, l := range m.Label {
			if !slices.Contains(labels, l.GetName()) {
				labels = append(labels, l.GetName())
			}
		}
	}
	return labels, true
}

// checkNames checks that every series selector of expr names an exported
// metric, with labels its series have, and that every aggregation groups
// by labels of the series it aggregates.
func checkNames(t *testing.T, where string, expr parser.Expr, families map[string]*dto.MetricFamily) {
	t.Helper()
	labelsOf := func(vs *parser.VectorSelector) []string {
		labels, ok := family(vs.Name, families)
		if !ok {
			t.Errorf("%s: %s is not a metric floodgate serve exports", where, vs.Name)
		}
		return labels
	}
	for _, vs := range selectors(expr) {
		labels := labelsOf(vs)
		for _, m := range vs.LabelMatchers {
			if m.Name != model.MetricNameLabel && labels != nil && !slices.Contains(labels, m.Name) {
				t.Errorf("%s: %s selects label %s, which its series lack (they have %v)", where, vs.Name, m.Name, labels)
			}
		}
	}
	parser.Inspect(expr, func(n parser.Node, _ []parser.Node) error {
		agg, ok := n.(*parser.AggregateExpr)
		if !ok || agg.Without {
			return nil
		}
		var have []string
		for _, vs := range selectors(agg.Expr) {
			labels, ok := family(vs.Name, families)
			if !ok {
				return nil // reported above
			}
			have = append(have, labels...)
		}
		for _, l := range agg.Grouping {
			if !slices.Contains(have, l) {
				t.Errorf("%s: %s groups by %s, which the series it aggregates lack (%v)", where, agg.Op, l, have)
			}
		}
		return nil
	})
}

// buildFloodgate builds the floodgate command from this checkout, in the
// library's module (with its go.mod, not this module's).
func buildFloodgate(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "floodgate")
	build := exec.Command("go", "build", "-o", bin, "./cmd/floodgate")
	build.Dir = "../.."
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("building floodgate: %v\n%s", err, out)
	}
	return bin
}

// The rules serve runs with: a floodgate rule that denies its second
// request, a shadow one, and an Envoy domain.
const (
	testRules = `rules:
  - name: api
    algorithm: token-bucket
    rate: 1
    period: 1m
    burst: 1
  - name: trial
    algorithm: fixed-window
    limit: 1
    window: 1m
    shadow: true
`
	testEnvoy = `domain: edge
descriptors:
  - key: path
    rate_limit:
      unit: minute
      requests_per_unit: 2
  - key: trial
    shadow_mode: true
    rate_limit:
      unit: minute
      requests_per_unit: 1
`
	testToken = "t0ken"
)

// exported runs floodgate serve (on Redis at redisAddr, or the embedded
// store when empty), makes its lazily made series appear, and returns
// its /metrics as Prometheus parses them.
func exported(t *testing.T, bin, redisAddr string) map[string]*dto.MetricFamily {
	t.Helper()
	dir := t.TempDir()
	for name, content := range map[string]string{"rules.yaml": testRules, "envoy.yaml": testEnvoy} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	args := []string{"serve", "--http", "127.0.0.1:0", "--resp", "127.0.0.1:0", "--config", dir, "--watch", "0", "--ui=false", "--token", testToken}
	if redisAddr != "" {
		args = append(args, "--redis", "redis://"+redisAddr, "--redis-monitor", "100ms")
	}
	fg := servetest.Start(t, exec.Command(bin, args...), true)
	cmd, httpURL, respAddr := fg.Cmd, fg.HTTPURL, fg.RESPAddr

	ctx := context.Background()
	post := func(path, body string) {
		t.Helper()
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, httpURL+path, strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Authorization", "Bearer "+testToken)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
	// allowed, denied and shadow_denied decisions, store latency, and
	// Envoy's counters within, near and over the limit.
	for range 2 {
		post("/v1/check", `{"rule":"api","key":"k"}`)
		post("/v1/check", `{"rule":"trial","key":"k"}`)
	}
	for range 3 {
		post("/json", `{"domain":"edge","descriptors":[{"entries":[{"key":"path","value":"/"}]},{"entries":[{"key":"trial","value":"t"}]}]}`)
	}
	// A wrong password on the Redis protocol.
	c := redis.NewClient(&redis.Options{Addr: respAddr, Password: "wrong", MaxRetries: -1})
	if err := c.Ping(ctx).Err(); err == nil {
		t.Error("AUTH with a wrong password succeeded")
	}
	c.Close()
	// A key that holds another type than floodgate's: a key error.
	if redisAddr != "" {
		rc := redis.NewClient(&redis.Options{Addr: redisAddr})
		defer rc.Close()
		keys, err := rc.Keys(ctx, "floodgate:*r3:api:k*").Result()
		if err != nil || len(keys) == 0 {
			t.Fatalf("the api rule's keys in Redis: %v %v", keys, err)
		}
		for _, k := range keys {
			rc.Del(ctx, k)
			rc.RPush(ctx, k, "not floodgate's")
		}
		post("/v1/check", `{"rule":"api","key":"k"}`)
	}
	// A reload that succeeds, then one that fails.
	if err := cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	waitMetric(t, httpURL, `floodgate_config_reloads_total{result="success"}`)
	if err := os.WriteFile(filepath.Join(dir, "rules.yaml"), []byte("rules: [{name: broken}]\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	waitMetric(t, httpURL, `floodgate_config_reloads_total{result="failure"}`)
	if redisAddr != "" {
		waitMetric(t, httpURL, `floodgate_redis_maxmemory_policy_info{policy=`)
		waitMetric(t, httpURL, `floodgate_key_errors_total{`)
	}

	text := waitMetric(t, httpURL, "")
	p := expfmt.NewTextParser(model.LegacyValidation)
	families, err := p.TextToMetricFamilies(strings.NewReader(text))
	if err != nil {
		t.Fatalf("Prometheus cannot parse /metrics: %v\n%s", err, text)
	}
	return families
}

// waitMetric returns /metrics once it holds a line that starts with
// prefix, failing after 10 seconds.
func waitMetric(t *testing.T, httpURL, prefix string) string {
	t.Helper()
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	deadline := time.After(10 * time.Second)
	var text string
	for {
		resp, err := http.Get(httpURL + "/metrics")
		if err == nil {
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			text = string(b)
			if strings.HasPrefix(text, prefix) || strings.Contains(text, "\n"+prefix) {
				return text
			}
		}
		select {
		case <-tick.C:
		case <-deadline:
			t.Fatalf("no %s in /metrics within 10s (last error %v):\n%s", prefix, err, text)
		}
	}
}
