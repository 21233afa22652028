package httpapi

import (
	"errors"
	"io"
	"net/http"

	rls "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/encoding/protojson"

	"github.com/floodgate/floodgate/internal/service"
)

// maxEnvoyBody bounds a POST /json body.
const maxEnvoyBody = 1 << 20

// envoyJSON is envoyproxy/ratelimit's POST /json: a RateLimitRequest in
// protobuf's JSON mapping, answered with the RateLimitResponse in JSON,
// status 429 when its overall code is OVER_LIMIT. A malformed body, an
// empty domain or no descriptors get 400, as there; a failing store 500.
func (a *api) envoyJSON(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxEnvoyBody))
	if err != nil {
		problem(w, http.StatusBadRequest, "reading the body: "+err.Error())
		return
	}
	if err := checkUTF8(body); err != nil {
		problem(w, http.StatusBadRequest, err.Error())
		return
	}
	var req rls.RateLimitRequest
	if err := protojson.Unmarshal(body, &req); err != nil {
		problem(w, http.StatusBadRequest, "the body is not a RateLimitRequest in JSON: "+err.Error())
		return
	}
	resp, err := a.svc.ShouldRateLimit(r.Context(), &req)
	switch {
	case errors.Is(err, service.ErrBadRequest):
		problem(w, http.StatusBadRequest, err.Error())
		return
	case err != nil:
		a.o.Logger.Error("floodgate: /json failed", "error", err.Error())
		problem(w, http.StatusInternalServerError, err.Error())
		return
	}
	out, err := protojson.Marshal(resp)
	if err != nil {
		problem(w, http.StatusInternalServerError, err.Error())
		return
	}
	w.Header().Set("Content-Type", "application/json")
	if resp.OverallCode == rls.RateLimitResponse_OVER_LIMIT {
		w.WriteHeader(http.StatusTooManyRequests)
	}
	w.Write(out)
}
