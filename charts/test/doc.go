// Package charttest lints and renders the Helm chart in charts/floodgate
// with Helm's own packages, for its default values and a table of value
// sets, and decodes every object strictly into its Kubernetes type, so
// that a misspelt field, an invalid value or a probe on a path floodgate
// does not serve fails. It is a module of its own, so that the library's
// go.mod does not carry Helm's and Kubernetes' dependencies.
package charttest
