package httpapi

import (
	"errors"
	"mime"
	"net/http"

	"github.com/floodgate/floodgate"
)

// explain answers GET /v1/explain?rule=R&key=K: why a check of the key
// under the rule is decided as it is now (service.Explanation), charging
// nothing; for a concurrency rule, its slots held on the key, when the
// earliest frees, and the rate rules an acquire decides with them,
// acquiring nothing. A missing rule or key, or a key over the maximum, gets 400; an
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

// jsonOnly passes h the requests whose body is sent as application/json,
// and answers others 415, as every POST of /v1/ is (a web page cannot
// post a form to it). /json alone takes any, as envoyproxy/ratelimit's.
func jsonOnly(h http.Handler) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if mt, _, err := mime.ParseMediaType(r.Header.Get("Content-Type")); err != nil || mt != "application/json" {
			problem(w, http.StatusUnsupportedMediaType, "the body must be JSON, sent as Content-Type: application/json")
			return
		}
		h.ServeHTTP(w, r)
	}
}
