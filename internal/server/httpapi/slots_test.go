package httpapi_test

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/floodgate/floodgate"
	"github.com/floodgate/floodgate/internal/server/config"
	"github.com/floodgate/floodgate/internal/server/httpapi"
	"github.com/floodgate/floodgate/storetest"
)

func TestSlotEndpoints(t *testing.T) {
	st := floodgate.NewMemoryStore(&floodgate.MemoryOptions{Clock: storetest.NewClock(storetest.Base), SweepInterval: -1})
	t.Cleanup(func() { st.Close() })
	cfg, err := config.Parse("r.yaml", []byte("concurrency: [{name: llm, slots: 1, lease: 30s}]\n"))
	if err != nil {
		t.Fatal(err)
	}
	h := handlerOn(t, st, cfg, &httpapi.Options{})
	post := func(path, body string) (int, httpapi.SlotResponse, string) {
		req := httptest.NewRequest("POST", path, strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		var out httpapi.SlotResponse
		json.Unmarshal(rec.Body.Bytes(), &out)
		return rec.Code, out, rec.Body.String()
	}
	code, a, body := post("/v1/acquire", `{"rule":"llm","key":"u1"}`)
	exp := storetest.Base.UnixMilli() + 30000
	if code != 200 || !a.Allowed || a.Held != 1 || a.Limit != 1 || len(a.Permit) != floodgate.PermitIDLen || a.ExpiresAtMs != exp || a.LeaseMs != 30000 {
		t.Fatalf("acquire: %d %s", code, body)
	}
	if code, d, body := post("/v1/acquire", `{"rule":"llm","key":"u1"}`); code != 200 || d.Allowed || d.RetryAfterMs != 30000 || d.Permit != "" {
		t.Fatalf("second acquire: %d %s", code, body)
	}
	if code, d, body := post("/v1/extend", `{"rule":"llm","key":"u1","permit":"`+a.Permit+`"}`); code != 200 || !d.Allowed || d.Permit != a.Permit {
		t.Fatalf("extend: %d %s", code, body)
	}
	for i, want := range []bool{true, false} {
		if code, d, body := post("/v1/release", `{"rule":"llm","key":"u1","permit":"`+a.Permit+`"}`); code != 200 || d.Allowed != want || d.Held != 0 {
			t.Fatalf("release %d: %d %s", i, code, body)
		}
	}
	for _, tc := range []struct {
		path, body string
		status     int
		want       string
	}{
		{"/v1/release", `{"rule":"llm","key":"u2","permit":"` + a.Permit + `"}`, 400, "another key"},
		{"/v1/release", `{"rule":"llm","key":"u1","permit":"` + strings.Repeat("a", 100) + `"}`, 400, "more than the maximum"},
		{"/v1/extend", `{"rule":"llm","key":"u1","permit":"forged"}`, 400, "not a permit id"},
		{"/v1/release", `{"rule":"llm","key":"u1"}`, 400, "empty permit id"},
		{"/v1/acquire", `{"rule":"llm","key":"u1","permit":"x"}`, 400, "takes no permit"},
		{"/v1/acquire", `{"rule":"nope","key":"u1"}`, 404, "no concurrency rule"},
		{"/v1/acquire", `{"rule":"llm","key":""}`, 400, "empty key"},
	} {
		code, _, body := post(tc.path, tc.body)
		if code != tc.status || !strings.Contains(body, tc.want) {
			t.Errorf("%s %s: %d %s, want %d %q", tc.path, tc.body, code, body, tc.status, tc.want)
		}
	}
	// GET /v1/explain takes a concurrency rule, and acquires nothing.
	post("/v1/acquire", `{"rule":"llm","key":"u3"}`)
	for range 2 {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest("GET", "/v1/explain?rule=llm&key=u3", nil))
		if body := rec.Body.String(); rec.Code != 200 || !strings.Contains(body, `"concurrency":{"slots":1,"lease_ms":30000,"held":1,"free_in_ms":30000}`) ||
			!strings.Contains(body, `"allowed":false`) || !strings.Contains(body, "an acquire would be denied: all 1 slot is held") {
			t.Fatalf("GET /v1/explain?rule=llm&key=u3: %d %s", rec.Code, body)
		}
	}
	if rec := httptest.NewRecorder(); true {
		h.ServeHTTP(rec, httptest.NewRequest("GET", "/v1/acquire", nil))
		if rec.Code != http.StatusMethodNotAllowed {
			t.Errorf("GET /v1/acquire: %d", rec.Code)
		}
	}
}
