package charttest

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/floodgate/floodgate"
	"github.com/floodgate/floodgate/internal/server/config"
	"github.com/floodgate/floodgate/internal/server/httpapi"
	"github.com/floodgate/floodgate/internal/server/service"
	"github.com/floodgate/floodgate/redisstore"
	"helm.sh/helm/v3/pkg/chart"
	"helm.sh/helm/v3/pkg/chart/loader"
	"helm.sh/helm/v3/pkg/chartutil"
	"helm.sh/helm/v3/pkg/engine"
	"helm.sh/helm/v3/pkg/lint"
	"helm.sh/helm/v3/pkg/lint/support"
	appsv1 "k8s.io/api/apps/v1"
	autoscalingv2 "k8s.io/api/autoscaling/v2"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	kjson "sigs.k8s.io/json"
	"sigs.k8s.io/yaml"
)

// chartDir is the chart, from this module's directory.
const chartDir = "../floodgate"

// The Prometheus Operator's kinds, as far as the chart uses them: decoding
// into them strictly catches a misspelt field as the typed kinds do.
type objectMeta struct {
	Name        string            `json:"name"`
	Namespace   string            `json:"namespace,omitempty"`
	Labels      map[string]string `json:"labels,omitempty"`
	Annotations map[string]string `json:"annotations,omitempty"`
}

type serviceMonitor struct {
	APIVersion string     `json:"apiVersion"`
	Kind       string     `json:"kind"`
	Metadata   objectMeta `json:"metadata"`
	Spec       struct {
		Selector struct {
			MatchLabels map[string]string `json:"matchLabels"`
		} `json:"selector"`
		Endpoints []struct {
			Port     string `json:"port"`
			Path     string `json:"path"`
			Interval string `json:"interval"`
			Scheme   string `json:"scheme"`
		} `json:"endpoints"`
	} `json:"spec"`
}

type prometheusRule struct {
	APIVersion string     `json:"apiVersion"`
	Kind       string     `json:"kind"`
	Metadata   objectMeta `json:"metadata"`
	Spec       struct {
		Groups []ruleGroup `json:"groups"`
	} `json:"spec"`
}

// rendered is a release's objects, decoded.
type rendered struct {
	deployment      *appsv1.Deployment
	services        map[string]*corev1.Service // by name
	configMaps      []*corev1.ConfigMap        // the rules'
	dashboards      []*corev1.ConfigMap        // Grafana's, by their floodgate.json
	serviceAccounts []*corev1.ServiceAccount
	pdb             *policyv1.PodDisruptionBudget
	hpa             *autoscalingv2.HorizontalPodAutoscaler
	serviceMonitor  *serviceMonitor
	prometheusRule  *prometheusRule
	notes           string
}

// release is the release name the test renders; fullname is then
// "fg-floodgate".
const release = "fg"

// sets are the value sets rendered, each with what to check of it.
var sets = []struct {
	name   string
	values string // YAML
	check  func(t *testing.T, r *rendered, env map[string]string)
}{
	{name: "default", check: func(t *testing.T, r *rendered, env map[string]string) {
		if _, ok := env["FLOODGATE_REDIS"]; ok {
			t.Error("the default values use Redis; want the embedded store")
		}
		if r.pdb == nil || r.hpa != nil || r.serviceMonitor != nil || r.prometheusRule != nil || len(r.dashboards) > 0 {
			t.Errorf("default: pdb %v, hpa %v, monitor %v, rule %v, dashboards %d; want only the PDB", r.pdb != nil, r.hpa != nil, r.serviceMonitor != nil, r.prometheusRule != nil, len(r.dashboards))
		}
		if n := len(r.deployment.Spec.Template.Spec.TopologySpreadConstraints); n != 2 {
			t.Errorf("%d topology spread constraints, want 2 (nodes and zones)", n)
		}
	}},
	{name: "memory", values: "replicaCount: 1\npodDisruptionBudget: {enabled: false}\nmemory: {maxKeys: 1000, maxBytes: 64MiB}\n",
		check: func(t *testing.T, r *rendered, env map[string]string) {
			if r.pdb != nil {
				t.Error("a PDB with podDisruptionBudget.enabled false")
			}
			want(t, env, "FLOODGATE_MEMORY_MAX_KEYS", "1000")
			want(t, env, "FLOODGATE_MEMORY_MAX_BYTES", "64MiB")
		}},
	{name: "redis-standalone", values: "redis: {enabled: true, addresses: [redis-master:6379], db: 2, passwordSecret: {name: redis, key: redis-password}}\n",
		check: func(t *testing.T, r *rendered, env map[string]string) {
			want(t, env, "FLOODGATE_REDIS", "redis://:s3cret@redis-master:6379/2")
			want(t, env, "FLOODGATE_INSTANCES", "2")
			want(t, env, "FLOODGATE_FALLBACK", "local")
		}},
	{name: "redis-sentinel", values: "redis:\n  enabled: true\n  mode: sentinel\n  masterName: mymaster\n  addresses: [s1:26379, s2:26379, s3:26379]\n  passwordSecret: {name: redis, key: password}\n  sentinelPasswordSecret: {name: sentinel, key: password}\n",
		check: func(t *testing.T, r *rendered, env map[string]string) {
			want(t, env, "FLOODGATE_REDIS", "redis+sentinel://:s3cret@s1:26379/0?master_name=mymaster&addr=s2:26379&addr=s3:26379&password=s3cret")
		}},
	{name: "redis-cluster", values: "redis: {enabled: true, mode: cluster, username: fg, addresses: [n1:6379, n2:6379], passwordSecret: {name: redis, key: password}, fallback: fail-open}\n",
		check: func(t *testing.T, r *rendered, env map[string]string) {
			want(t, env, "FLOODGATE_REDIS", "redis+cluster://fg:s3cret@n1:6379?addr=n2:6379")
			want(t, env, "FLOODGATE_FALLBACK", "fail-open")
		}},
	{name: "redis-url-secret", values: "redis: {enabled: true, urlSecret: {name: redis-url, key: url}}\n",
		check: func(t *testing.T, r *rendered, env map[string]string) {
			want(t, env, "FLOODGATE_REDIS", "s3cret") // the Secret's value
		}},
	{name: "tls", values: "redis: {enabled: true, addresses: [redis.example.com:6380], tls: {enabled: true, caSecret: {name: redis-ca, key: ca.crt}}}\ntls: {enabled: true, secretName: floodgate-tls}\nauth: {existingSecret: floodgate-token}\n",
		check: func(t *testing.T, r *rendered, env map[string]string) {
			want(t, env, "FLOODGATE_REDIS", "rediss://redis.example.com:6380/0")
			want(t, env, "SSL_CERT_DIR", "/etc/floodgate-redis-ca")
			want(t, env, "FLOODGATE_TLS_CERT", "/etc/floodgate-tls/tls.crt")
			want(t, env, "FLOODGATE_TOKEN", "s3cret")
			c := r.deployment.Spec.Template.Spec.Containers[0]
			if c.LivenessProbe.HTTPGet.Scheme != corev1.URISchemeHTTPS || c.ReadinessProbe.HTTPGet.Scheme != corev1.URISchemeHTTPS {
				t.Error("probes are not HTTPS with tls.enabled")
			}
			mounts := map[string]bool{}
			for _, m := range c.VolumeMounts {
				mounts[m.MountPath] = m.ReadOnly
			}
			for _, p := range []string{"/etc/floodgate-tls", "/etc/floodgate-redis-ca"} {
				if ro, ok := mounts[p]; !ok || !ro {
					t.Errorf("%s not mounted read-only: %v", p, mounts)
				}
			}
		}},
	{name: "autoscaling", values: "autoscaling: {enabled: true, minReplicas: 3, maxReplicas: 12}\nredis: {enabled: true}\n",
		check: func(t *testing.T, r *rendered, env map[string]string) {
			if r.hpa == nil || r.hpa.Spec.MaxReplicas != 12 || *r.hpa.Spec.MinReplicas != 3 || r.hpa.Spec.ScaleTargetRef.Name != r.deployment.Name {
				t.Fatalf("HPA %+v, want 3 to 12 of %s", r.hpa, r.deployment.Name)
			}
			if r.deployment.Spec.Replicas != nil {
				t.Error("the Deployment sets replicas under an HPA: each upgrade would reset them")
			}
			want(t, env, "FLOODGATE_INSTANCES", "3")
		}},
	{name: "monitoring", values: "serviceMonitor: {enabled: true, labels: {release: prom}}\nprometheusRule: {enabled: true}\nredis: {enabled: true}\n",
		check: func(t *testing.T, r *rendered, env map[string]string) {
			sm := r.serviceMonitor
			if sm == nil || len(sm.Spec.Endpoints) != 1 || sm.Spec.Endpoints[0].Path != "/metrics" || sm.Metadata.Labels["release"] != "prom" {
				t.Fatalf("ServiceMonitor %+v", sm)
			}
			http := r.services[r.deployment.Name+"-http"]
			for k, v := range sm.Spec.Selector.MatchLabels {
				if http.Labels[k] != v {
					t.Errorf("the ServiceMonitor selects %s=%s, which the HTTP Service lacks", k, v)
				}
			}
			if !slices.ContainsFunc(http.Spec.Ports, func(p corev1.ServicePort) bool { return p.Name == sm.Spec.Endpoints[0].Port }) {
				t.Errorf("the ServiceMonitor scrapes port %q, which the HTTP Service lacks", sm.Spec.Endpoints[0].Port)
			}
			// The PrometheusRule holds the alerts file's rules, on the job
			// Prometheus gives the HTTP Service's endpoints.
			if r.prometheusRule == nil {
				t.Fatal("no PrometheusRule")
			}
			if got, want := r.prometheusRule.Spec.Groups, chartRules(t, http.Name); !reflect.DeepEqual(got, want) {
				g, _ := json.MarshalIndent(got, "", " ")
				w, _ := json.MarshalIndent(want, "", " ")
				t.Errorf("the PrometheusRule's rules differ from %s on job %s:\n got %s\nwant %s", alertsFile, http.Name, g, w)
			}
			if len(r.dashboards) > 0 {
				t.Error("a dashboard ConfigMap with monitoring.grafanaDashboard.enabled false")
			}
		}},
	{name: "grafana-dashboard", values: "monitoring: {grafanaDashboard: {enabled: true, namespace: grafana, annotations: {grafana_folder: Rate limits}}}\n",
		check: func(t *testing.T, r *rendered, env map[string]string) {
			if len(r.dashboards) != 1 {
				t.Fatalf("%d dashboard ConfigMaps, want 1", len(r.dashboards))
			}
			c := r.dashboards[0]
			want, err := os.ReadFile(dashboardFile)
			if err != nil {
				t.Fatal(err)
			}
			if c.Data["floodgate.json"] != string(want) {
				t.Errorf("the ConfigMap's floodgate.json differs from %s", dashboardFile)
			}
			if c.Labels["grafana_dashboard"] != "1" || c.Namespace != "grafana" || c.Annotations["grafana_folder"] != "Rate limits" {
				t.Errorf("dashboard ConfigMap %s/%s labels %v annotations %v, want grafana_dashboard=1 in grafana, folder Rate limits", c.Namespace, c.Name, c.Labels, c.Annotations)
			}
		}},
	{name: "grafana-dashboard-label", values: "monitoring: {grafanaDashboard: {enabled: true, label: example.com/dashboard, labelValue: floodgate}}\n",
		check: func(t *testing.T, r *rendered, env map[string]string) {
			if len(r.dashboards) != 1 || r.dashboards[0].Labels["example.com/dashboard"] != "floodgate" || r.dashboards[0].Namespace != "" {
				t.Fatalf("dashboards %+v, want one labelled example.com/dashboard=floodgate in the release's namespace", r.dashboards)
			}
		}},
}

// bad are value sets the chart must refuse.
var bad = []struct{ name, values, wantErr string }{
	{"misspelt value", "replicas: 3\n", "replicas"},
	{"misspelt nested value", "redis: {enable: true}\n", "enable"},
	{"unknown mode", "redis: {enabled: true, mode: replicated}\n", "mode"},
	{"unknown fallback", "redis: {fallback: maybe}\n", "fallback"},
	{"bad duration", "watch: soon\n", "watch"},
	{"tls without a secret", "tls: {enabled: true}\n", "tls.secretName"},
	{"removed errorRatio", "prometheusRule: {enabled: true, errorRatio: 0.05}\n", "errorRatio"},
	{"dashboard label not a label", "monitoring: {grafanaDashboard: {enabled: true, label: \"grafana dashboard\"}}\n", "label"},
}

func TestLintDefault(t *testing.T) {
	checkLint(t, nil)
}

func TestRender(t *testing.T) {
	ch, err := loader.Load(chartDir)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range sets {
		t.Run(tc.name, func(t *testing.T) {
			vals := parseValues(t, tc.values)
			checkLint(t, vals)
			r := render(t, ch, vals)
			env := podEnv(t, r.deployment)
			checkCommon(t, r, env)
			tc.check(t, r, env)
		})
	}
}

func TestRefuse(t *testing.T) {
	ch, err := loader.Load(chartDir)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range bad {
		t.Run(tc.name, func(t *testing.T) {
			_, err := renderFiles(ch, parseValues(t, tc.values))
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("error %v, want one naming %q", err, tc.wantErr)
			}
		})
	}
}

// checkLint runs helm lint, strict: a warning fails too.
func checkLint(t *testing.T, vals map[string]any) {
	t.Helper()
	l := lint.AllWithKubeVersion(chartDir, vals, "default", nil)
	for _, m := range l.Messages {
		if m.Severity >= support.WarningSev {
			t.Errorf("helm lint: %s", m)
		} else {
			t.Logf("helm lint: %s", m)
		}
	}
}

func parseValues(t *testing.T, s string) map[string]any {
	t.Helper()
	vals := map[string]any{}
	if err := yaml.Unmarshal([]byte(s), &vals); err != nil {
		t.Fatalf("values %q: %v", s, err)
	}
	return vals
}

// renderFiles renders the chart as helm install would, validating the
// values against values.schema.json.
func renderFiles(ch *chart.Chart, vals map[string]any) (map[string]string, error) {
	caps := chartutil.DefaultCapabilities.Copy()
	rv, err := chartutil.ToRenderValues(ch, vals, chartutil.ReleaseOptions{Name: release, Namespace: "default", IsInstall: true, Revision: 1}, caps)
	if err != nil {
		return nil, err
	}
	return engine.Render(ch, rv)
}

// render renders the chart and decodes every object strictly.
func render(t *testing.T, ch *chart.Chart, vals map[string]any) *rendered {
	t.Helper()
	files, err := renderFiles(ch, vals)
	if err != nil {
		t.Fatalf("render: %v", err)
	}
	r := &rendered{services: map[string]*corev1.Service{}}
	for name, content := range files {
		if strings.HasSuffix(name, "NOTES.txt") {
			r.notes = content
			continue
		}
		for _, doc := range regexp.MustCompile(`(?m)^---\s*$`).Split(content, -1) {
			if strings.TrimSpace(stripComments(doc)) == "" {
				continue
			}
			var head struct{ APIVersion, Kind string }
			if err := yaml.Unmarshal([]byte(doc), &head); err != nil {
				t.Fatalf("%s: %v\n%s", name, err, doc)
			}
			var obj any
			switch head.APIVersion + " " + head.Kind {
			case "apps/v1 Deployment":
				if r.deployment != nil {
					t.Fatal("two Deployments")
				}
				r.deployment = &appsv1.Deployment{}
				obj = r.deployment
			case "v1 Service":
				s := &corev1.Service{}
				defer func() { r.services[s.Name] = s }()
				obj = s
			case "v1 ConfigMap":
				c := &corev1.ConfigMap{}
				r.configMaps = append(r.configMaps, c)
				obj = c
			case "v1 ServiceAccount":
				s := &corev1.ServiceAccount{}
				r.serviceAccounts = append(r.serviceAccounts, s)
				obj = s
			case "policy/v1 PodDisruptionBudget":
				r.pdb = &policyv1.PodDisruptionBudget{}
				obj = r.pdb
			case "autoscaling/v2 HorizontalPodAutoscaler":
				r.hpa = &autoscalingv2.HorizontalPodAutoscaler{}
				obj = r.hpa
			case "monitoring.coreos.com/v1 ServiceMonitor":
				r.serviceMonitor = &serviceMonitor{}
				obj = r.serviceMonitor
			case "monitoring.coreos.com/v1 PrometheusRule":
				r.prometheusRule = &prometheusRule{}
				obj = r.prometheusRule
			default:
				t.Fatalf("%s: unexpected %s %s", name, head.APIVersion, head.Kind)
			}
			if err := decodeStrict(doc, obj); err != nil {
				t.Fatalf("%s: %s %s does not decode strictly: %v\n%s", name, head.APIVersion, head.Kind, err, doc)
			}
		}
	}
	if r.deployment == nil {
		t.Fatal("no Deployment")
	}
	r.configMaps = slices.DeleteFunc(r.configMaps, func(c *corev1.ConfigMap) bool {
		_, dash := c.Data["floodgate.json"]
		if dash {
			r.dashboards = append(r.dashboards, c)
		}
		return dash
	})
	return r
}

// decodeStrict decodes a YAML object as the API server would, and more
// strictly: field names match case and all, and an unknown or duplicate
// field is an error. (encoding/json, and so sigs.k8s.io/yaml's
// UnmarshalStrict, match field names regardless of case: a misspelt
// readOnlyRootFileSystem would pass.)
func decodeStrict(doc string, obj any) error {
	js, err := yaml.YAMLToJSON([]byte(doc))
	if err != nil {
		return err
	}
	strict, err := kjson.UnmarshalStrict(js, obj, kjson.DisallowDuplicateFields, kjson.DisallowUnknownFields)
	if err != nil {
		return err
	}
	return errors.Join(strict...)
}

func stripComments(doc string) string {
	var b strings.Builder
	for _, l := range strings.Split(doc, "\n") {
		if !strings.HasPrefix(strings.TrimSpace(l), "#") {
			b.WriteString(l + "\n")
		}
	}
	return b.String()
}

// podEnv returns the container's environment as Kubernetes would set it:
// a Secret's value is "s3cret", and $(NAME) of a variable defined before
// is replaced by its value.
func podEnv(t *testing.T, d *appsv1.Deployment) map[string]string {
	t.Helper()
	env := map[string]string{}
	ref := regexp.MustCompile(`\$\(([A-Za-z_][A-Za-z0-9_]*)\)`)
	for _, e := range d.Spec.Template.Spec.Containers[0].Env {
		if _, dup := env[e.Name]; dup {
			t.Errorf("$%s set twice", e.Name)
		}
		v := e.Value
		if e.ValueFrom != nil {
			if e.ValueFrom.SecretKeyRef == nil || e.ValueFrom.SecretKeyRef.Name == "" || e.ValueFrom.SecretKeyRef.Key == "" {
				t.Errorf("$%s from %+v, want a Secret's key", e.Name, e.ValueFrom)
			}
			v = "s3cret"
		}
		env[e.Name] = ref.ReplaceAllStringFunc(v, func(m string) string {
			name := ref.FindStringSubmatch(m)[1]
			val, ok := env[name]
			if !ok {
				t.Errorf("$%s refers to $(%s), not defined before it: Kubernetes would leave it as is", e.Name, name)
			}
			return val
		})
	}
	return env
}

func want(t *testing.T, env map[string]string, name, value string) {
	t.Helper()
	if got, ok := env[name]; !ok || got != value {
		t.Errorf("$%s = %q (set: %v), want %q", name, got, ok, value)
	}
}

// checkCommon checks what every value set must give: the security
// settings, probes on endpoints floodgate serves, ports that match the
// listeners, rules that floodgate parses, a Redis URL it reads, Services
// that select the pods, and notes that name the dashboard.
func checkCommon(t *testing.T, r *rendered, env map[string]string) {
	t.Helper()
	pod := r.deployment.Spec.Template.Spec
	if len(pod.Containers) != 1 {
		t.Fatalf("%d containers, want 1", len(pod.Containers))
	}
	c := pod.Containers[0]
	psc, sc := pod.SecurityContext, c.SecurityContext
	switch {
	case psc == nil || sc == nil:
		t.Fatal("no securityContext")
	case psc.RunAsNonRoot == nil || !*psc.RunAsNonRoot || psc.RunAsUser == nil || *psc.RunAsUser == 0:
		t.Error("the pod may run as root")
	case psc.SeccompProfile == nil || psc.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault:
		t.Error("seccompProfile is not RuntimeDefault")
	case sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem:
		t.Error("the root filesystem is writable")
	case sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation:
		t.Error("privilege escalation allowed")
	case sc.Capabilities == nil || !slices.Equal(sc.Capabilities.Drop, []corev1.Capability{"ALL"}) || len(sc.Capabilities.Add) > 0:
		t.Errorf("capabilities %+v, want drop ALL", sc.Capabilities)
	case pod.AutomountServiceAccountToken == nil || *pod.AutomountServiceAccountToken:
		t.Error("the service account token is mounted; floodgate never calls the API")
	}
	if c.Resources.Requests.Cpu().IsZero() || c.Resources.Limits.Memory().IsZero() {
		t.Errorf("resources %+v, want a CPU request and a memory limit", c.Resources)
	}

	// Probes: on the HTTP port, on paths floodgate's mux answers 200.
	ports := map[string]int32{}
	for _, p := range c.Ports {
		ports[p.Name] = p.ContainerPort
	}
	for name, listen := range map[string]string{"http": "FLOODGATE_HTTP", "resp": "FLOODGATE_RESP", "grpc": "FLOODGATE_GRPC"} {
		if got := fmt.Sprintf(":%d", ports[name]); env[listen] != got {
			t.Errorf("$%s = %q, but port %s is %s", listen, env[listen], name, got)
		}
	}
	served := servedPaths(t)
	for what, p := range map[string]*corev1.Probe{"liveness": c.LivenessProbe, "readiness": c.ReadinessProbe} {
		if p == nil || p.HTTPGet == nil {
			t.Errorf("no HTTP %s probe", what)
			continue
		}
		if p.HTTPGet.Port.StrVal != "http" {
			t.Errorf("%s probe on port %v, want http", what, p.HTTPGet.Port.String())
		}
		if !served[p.HTTPGet.Path] {
			t.Errorf("%s probe on %s, which floodgate does not answer 200", what, p.HTTPGet.Path)
		}
	}
	if c.LivenessProbe.HTTPGet.Path != "/healthz" {
		t.Errorf("liveness on %s, want /healthz (/readyz fails with Redis: restarts would not help)", c.LivenessProbe.HTTPGet.Path)
	}

	// The rules: mounted as a directory (updates reach the pod), the file
	// floodgate reads, and rules it parses.
	if env["FLOODGATE_CONFIG"] != "/etc/floodgate/rules.yaml" {
		t.Errorf("$FLOODGATE_CONFIG = %q", env["FLOODGATE_CONFIG"])
	}
	for _, m := range c.VolumeMounts {
		if m.Name == "rules" && (m.MountPath != "/etc/floodgate" || m.SubPath != "") {
			t.Errorf("rules mounted at %s subPath %q: want the directory /etc/floodgate, without subPath (a subPath mount never sees an update)", m.MountPath, m.SubPath)
		}
	}
	if len(r.configMaps) != 1 {
		t.Fatalf("%d ConfigMaps, want 1 (the rules)", len(r.configMaps))
	}
	if _, err := config.Parse("rules.yaml", []byte(r.configMaps[0].Data["rules.yaml"])); err != nil {
		t.Errorf("the rules in the ConfigMap do not parse: %v", err)
	}
	for k := range r.deployment.Spec.Template.Annotations {
		if strings.HasPrefix(k, "checksum/") {
			t.Errorf("annotation %s restarts the pods on a rules change, which floodgate reloads without", k)
		}
	}

	// A Redis URL floodgate reads.
	if u, ok := env["FLOODGATE_REDIS"]; ok && u != "s3cret" {
		client, err := redisstore.NewClient(u)
		if err != nil {
			t.Errorf("$FLOODGATE_REDIS %q: %v", u, err)
		} else {
			client.Close()
		}
	}

	// Services: one per protocol, each selecting the pods on a port of
	// theirs.
	for _, proto := range []string{"http", "resp", "grpc"} {
		s := r.services[r.deployment.Name+"-"+proto]
		if s == nil {
			t.Errorf("no Service for %s: %v", proto, mapKeys(r.services))
			continue
		}
		for k, v := range s.Spec.Selector {
			if r.deployment.Spec.Template.Labels[k] != v {
				t.Errorf("Service %s selects %s=%s, which the pods lack", s.Name, k, v)
			}
		}
		if len(s.Spec.Ports) != 1 || s.Spec.Ports[0].TargetPort.StrVal != proto {
			t.Errorf("Service %s ports %+v, want one on the pods' %s", s.Name, s.Spec.Ports, proto)
		}
	}
	if r.pdb != nil {
		for k, v := range r.pdb.Spec.Selector.MatchLabels {
			if r.deployment.Spec.Template.Labels[k] != v {
				t.Errorf("the PDB selects %s=%s, which the pods lack", k, v)
			}
		}
	}
	if !strings.Contains(r.notes, "/ui/") {
		t.Errorf("NOTES.txt does not say where the dashboard is:\n%s", r.notes)
	}
}

// servedPaths returns the probe paths floodgate's HTTP handler answers
// 200 on, asked of the real handler.
func servedPaths(t *testing.T) map[string]bool {
	t.Helper()
	svc := newService(t)
	h := httpapi.Handler(svc, &httpapi.Options{Token: "t"})
	out := map[string]bool{}
	for _, p := range []string{"/healthz", "/readyz", "/metrics", "/nonexistent"} {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, p, nil))
		out[p] = rec.Code == http.StatusOK
	}
	if out["/nonexistent"] {
		t.Fatal("floodgate answers 200 on any path: the probe check proves nothing")
	}
	return out
}

func newService(t *testing.T) *service.Service {
	t.Helper()
	mem := floodgate.NewMemoryStore(nil)
	t.Cleanup(func() { mem.Close() })
	svc, err := service.New(mem, config.Example(), &service.Options{Memory: mem})
	if err != nil {
		t.Fatal(err)
	}
	return svc
}

func mapKeys[V any](m map[string]V) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}
