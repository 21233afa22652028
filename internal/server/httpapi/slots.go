package httpapi

import (
	"errors"
	"net/http"
	"time"

	"github.com/floodgate/floodgate"
	"github.com/floodgate/floodgate/internal/lib/arith"
	"github.com/floodgate/floodgate/internal/server/service"
)

// SlotRequest is the body of POST /v1/acquire (rule and key), and of
// /v1/release and /v1/extend (with the permit an acquire returned).
type SlotRequest struct {
	Rule   string `json:"rule"`
	Key    string `json:"key"`
	Permit string `json:"permit,omitempty"`
}

// SlotResponse is the answer to an acquire, release or extend. allowed
// says the operation did what it asked: a slot was taken, given back or
// renewed; false for a full key, or a permit not held (released already,
// expired). Times are milliseconds, rounded up; expires_at_ms is on the
// store's clock (Redis's), as Unix milliseconds.
type SlotResponse struct {
	Rule         string          `json:"rule"`
	Allowed      bool            `json:"allowed"`
	Limit        int64           `json:"limit"`
	Held         int64           `json:"held"`
	Permit       string          `json:"permit,omitempty"`
	ExpiresAtMs  int64           `json:"expires_at_ms,omitempty"`
	LeaseMs      int64           `json:"lease_ms,omitempty"`
	RetryAfterMs int64           `json:"retry_after_ms"`
	Source       string          `json:"source"`
	Rates        []CheckResponse `json:"rates,omitempty"` // the rate rules decided with an acquire
}

func newSlotResponse(d service.SlotDecision, lease time.Duration) SlotResponse {
	r := d.Result
	out := SlotResponse{Rule: d.Rule, Allowed: r.Allowed, Limit: r.Limit, Held: r.Held,
		RetryAfterMs: arith.RoundUp(r.RetryAfter, time.Millisecond), Source: r.Source.String()}
	if r.Permit.ID != "" {
		out.Permit, out.ExpiresAtMs, out.LeaseMs = r.Permit.ID, r.Permit.Expires.UnixMilli(), lease.Milliseconds()
	}
	for _, rd := range d.Rates {
		out.Rates = append(out.Rates, NewCheckResponse(rd))
	}
	return out
}

// slot serves /v1/acquire, /v1/release and /v1/extend.
func (a *api) slot(op string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		var c SlotRequest
		if !decode(w, r, &c) {
			return
		}
		var d service.SlotDecision
		var err error
		switch op {
		case "acquire":
			if c.Permit != "" {
				problem(w, http.StatusBadRequest, "an acquire takes no permit: the store issues it")
				return
			}
			d, err = a.svc.Acquire(r.Context(), c.Rule, c.Key)
		case "release":
			d, err = a.svc.Release(r.Context(), c.Rule, c.Key, c.Permit)
		default:
			d, err = a.svc.Extend(r.Context(), c.Rule, c.Key, c.Permit)
		}
		if err != nil {
			status := statusOf(err)
			if status >= 500 && !errors.Is(err, floodgate.ErrKey) {
				a.o.Logger.ErrorContext(r.Context(), "floodgate: "+op+" failed", "rule", c.Rule, "error", err.Error())
			}
			problem(w, status, err.Error())
			return
		}
		var lease time.Duration
		if s, ok := a.svc.Config().ConcurrencyRule(c.Rule); ok {
			lease = s.Lease
		}
		writeJSON(w, http.StatusOK, newSlotResponse(d, lease))
	}
}
