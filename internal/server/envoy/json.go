package envoy

import (
	"errors"
	"io"
	"log/slog"
	"net/http"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/encoding/protojson"

	"github.com/floodgate/floodgate/internal/lib/httpjson"
	"github.com/floodgate/floodgate/internal/server/service"
)

// maxEnvoyBody bounds a POST /json or /v1/explain/envoy body.
const maxEnvoyBody = 1 << 20

// JSONHandler is envoyproxy/ratelimit's POST /json: a RateLimitRequest in
// protobuf's JSON mapping, answered with the RateLimitResponse in JSON,
// status 429 when its overall code is OVER_LIMIT. A malformed body, an
// empty domain or no descriptors get 400, as there; a failing store 500,
// logged to log (default: slog.Default()). Its route, method and token
// are the HTTP API's (httpapi.Options.Envoy).
func (s *Service) JSONHandler(log *slog.Logger) http.Handler {
	if log == nil {
		log = slog.Default()
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { s.serveJSON(w, r, log) })
}

// readRequest reads the RateLimitRequest in protobuf's JSON mapping that
// POST /json and POST /v1/explain/envoy take, at most maxEnvoyBody bytes.
// When the body is not one it answers 400 and returns false.
func readRequest(w http.ResponseWriter, r *http.Request) (*rlsv3.RateLimitRequest, bool) {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxEnvoyBody))
	if err != nil {
		httpjson.Problem(w, http.StatusBadRequest, "reading the body: "+err.Error())
		return nil, false
	}
	if err := httpjson.CheckUTF8(body); err != nil {
		httpjson.Problem(w, http.StatusBadRequest, err.Error())
		return nil, false
	}
	var req rlsv3.RateLimitRequest
	if err := protojson.Unmarshal(body, &req); err != nil {
		httpjson.Problem(w, http.StatusBadRequest, "the body is not a RateLimitRequest in JSON: "+err.Error())
		return nil, false
	}
	return &req, true
}

func (s *Service) serveJSON(w http.ResponseWriter, r *http.Request, log *slog.Logger) {
	req, ok := readRequest(w, r)
	if !ok {
		return
	}
	resp, err := s.ShouldRateLimit(r.Context(), req)
	switch {
	case errors.Is(err, service.ErrBadRequest):
		httpjson.Problem(w, http.StatusBadRequest, err.Error())
		return
	case err != nil:
		log.ErrorContext(r.Context(), "floodgate: /json failed", "error", err.Error())
		httpjson.Problem(w, http.StatusInternalServerError, err.Error())
		return
	}
	out, err := protojson.Marshal(resp)
	if err != nil {
		httpjson.Problem(w, http.StatusInternalServerError, err.Error())
		return
	}
	w.Header().Set("Content-Type", "application/json")
	if resp.OverallCode == rlsv3.RateLimitResponse_OVER_LIMIT {
		w.WriteHeader(http.StatusTooManyRequests)
	}
	w.Write(out)
}
