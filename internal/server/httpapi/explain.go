package httpapi

import (
	"errors"
	"net/http"

	"github.com/floodgate/floodgate"
)

// explain answers GET /v1/explain?rule=R&key=K: why a check of the key
// under the rule is decided as it is now (service.Explanation), charging
// nothing. A missing rule or key, or a key over the maximum, gets 400; an
// unknown rule 404; a store that cannot inspect 501; a failing store 503.
func (a *api) explain(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	e, err := a.svc.Explain(r.Context(), q.Get("rule"), q.Get("key"))
	if err != nil {
		status := statusOf(err)
		if errors.Is(err, errors.ErrUnsupported) {
			status = http.StatusNotImplemented
		}
		if status >= 500 && !errors.Is(err, floodgate.ErrKey) { // the service logs those
			a.o.Logger.ErrorContext(r.Context(), "floodgate: explain failed", "rule", q.Get("rule"), "error", err.Error())
		}
		problem(w, status, err.Error())
		return
	}
	w.Header().Set("Cache-Control", "no-store")
	writeJSON(w, http.StatusOK, e)
}
