package httpapi

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"time"

	"github.com/floodgate/floodgate"
	"github.com/floodgate/floodgate/internal/server/config"
	"github.com/floodgate/floodgate/internal/server/service"
)

// This file serves per-key overrides:
//
//	PUT    /v1/overrides/{rule}/{key}   set (body: a limit's fields or limits, ttl, strategy)
//	GET    /v1/overrides/{rule}/{key}   read
//	DELETE /v1/overrides/{rule}/{key}   delete (?strategy=...)
//	GET    /v1/overrides[?rule=R]       list

// OverrideInfo describes an override in the API's answers.
type OverrideInfo struct {
	Rule   string      `json:"rule"`
	Key    string      `json:"key"`
	Limits []LimitInfo `json:"limits"`
	// TTLMs is the time it has left, in ms, rounded up; absent for ever.
	TTLMs int64 `json:"ttl_ms,omitempty"`
}

func newOverrideInfo(o service.Override) OverrideInfo {
	info := OverrideInfo{Rule: o.Rule, Key: o.Key, Limits: limitInfos(o.Limits)}
	if o.TTL > 0 {
		info.TTLMs = int64((o.TTL + time.Millisecond - 1) / time.Millisecond)
	}
	return info
}

func (a *api) overrideRoutes(mux *http.ServeMux) {
	const item = "/v1/overrides/{rule}/{key...}"
	mux.HandleFunc("PUT "+item, a.auth(a.putOverride))
	mux.HandleFunc("GET "+item, a.auth(a.getOverride))
	mux.HandleFunc("DELETE "+item, a.auth(a.deleteOverride))
	mux.HandleFunc("GET /v1/overrides", a.auth(a.listOverrides))
}

func (a *api) putOverride(w http.ResponseWriter, r *http.Request) {
	rule, key := r.PathValue("rule"), r.PathValue("key")
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, MaxBody))
	if err != nil {
		var tooBig *http.MaxBytesError
		if errors.As(err, &tooBig) {
			problem(w, http.StatusRequestEntityTooLarge, fmt.Sprintf("the body is larger than %d bytes", MaxBody))
			return
		}
		problem(w, http.StatusBadRequest, "the request body could not be read")
		return
	}
	if err := checkUTF8(body); err != nil {
		problem(w, http.StatusBadRequest, err.Error())
		return
	}
	o, err := config.ParseOverride("body", body)
	if err != nil {
		problem(w, http.StatusBadRequest, err.Error())
		return
	}
	if err := a.svc.SetOverride(r.Context(), rule, key, o); err != nil {
		a.overrideFailed(w, r, "set", rule, err)
		return
	}
	writeJSON(w, http.StatusOK, newOverrideInfo(service.Override{Rule: rule, Key: key, Limits: o.Limits, TTL: o.TTL}))
}

func (a *api) getOverride(w http.ResponseWriter, r *http.Request) {
	rule, key := r.PathValue("rule"), r.PathValue("key")
	o, ok, err := a.svc.GetOverride(r.Context(), rule, key)
	if err != nil {
		a.overrideFailed(w, r, "get", rule, err)
		return
	}
	if !ok {
		problem(w, http.StatusNotFound, fmt.Sprintf("key %q has no override under rule %q", key, rule))
		return
	}
	writeJSON(w, http.StatusOK, newOverrideInfo(o))
}

func (a *api) deleteOverride(w http.ResponseWriter, r *http.Request) {
	rule, key := r.PathValue("rule"), r.PathValue("key")
	st, err := floodgate.ParseStrategy(r.URL.Query().Get("strategy"))
	if err != nil {
		problem(w, http.StatusBadRequest, err.Error())
		return
	}
	if err := a.svc.DeleteOverride(r.Context(), rule, key, st); err != nil {
		a.overrideFailed(w, r, "delete", rule, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func (a *api) listOverrides(w http.ResponseWriter, r *http.Request) {
	list, more, err := a.svc.ListOverrides(r.Context(), r.URL.Query().Get("rule"))
	if err != nil {
		a.overrideFailed(w, r, "list", r.URL.Query().Get("rule"), err)
		return
	}
	out := make([]OverrideInfo, len(list))
	for i, o := range list {
		out[i] = newOverrideInfo(o)
	}
	writeJSON(w, http.StatusOK, map[string]any{"overrides": out, "truncated": more})
}

func (a *api) overrideFailed(w http.ResponseWriter, r *http.Request, what, rule string, err error) {
	status := statusOf(err)
	if status >= 500 {
		a.o.Logger.ErrorContext(r.Context(), "floodgate: override "+what+" failed", "rule", rule, "error", err.Error())
	}
	problem(w, status, err.Error())
}
