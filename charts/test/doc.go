// Package charttest lints and renders the Helm chart in charts/floodgate
// with Helm's own packages, for its default values and a table of value
// sets, and decodes every object strictly into its Kubernetes type, so
// that a misspelt field, an invalid value or a probe on a path floodgate
// does not serve fails. It checks the alerts and the Grafana dashboard
// the chart ships (and deploy/ copies) too: Prometheus's own rule loader
// and PromQL parser read them, and every metric and label they name must
// be on the /metrics of a floodgate serve built from this checkout. It is
// a module of its own, so that the library's go.mod does not carry Helm's,
// Kubernetes' and Prometheus's dependencies.
package charttest
