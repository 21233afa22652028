package httpapi_test

import (
	"bufio"
	"bytes"
	"encoding/json"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/floodgate/floodgate"
	"github.com/floodgate/floodgate/internal/server/config"
	"github.com/floodgate/floodgate/internal/server/httpapi"
	"github.com/floodgate/floodgate/internal/server/service"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// newHandler is the API on the example rule over a memory store of its
// own, with o.
func newHandler(t testing.TB, o *httpapi.Options) http.Handler {
	t.Helper()
	st := floodgate.NewMemoryStore(&floodgate.MemoryOptions{SweepInterval: -1})
	t.Cleanup(func() { st.Close() })
	return handlerOn(t, st, config.Example(), o)
}

// handlerOn is the API on cfg's rules over st, with o; the service's
// failures, and the API's unless o names a Logger, are logged nowhere.
func handlerOn(t testing.TB, st floodgate.Store, cfg *config.Config, o *httpapi.Options) http.Handler {
	t.Helper()
	svc, err := service.New(st, cfg, &service.Options{Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	return httpapi.Handler(svc, o)
}

// TestByTheBook covers the answers a client gets for requests that are
// wrong in form: method, media type, credentials.
func TestByTheBook(t *testing.T) {
	const check = `{"rule":"example","key":"k"}`
	tests := []struct {
		name      string
		opts      httpapi.Options
		method    string
		path      string
		ctype     string
		auth      string
		status    int
		wantAllow string
	}{
		{"check", httpapi.Options{}, "POST", "/v1/check", "application/json", "", 200, ""},
		{"media type with parameters", httpapi.Options{}, "POST", "/v1/check", "application/json; charset=utf-8", "", 200, ""},
		{"GET on a POST endpoint", httpapi.Options{}, "GET", "/v1/check", "", "", 405, "POST"},
		{"POST on a GET endpoint", httpapi.Options{}, "POST", "/v1/rules", "application/json", "", 405, "GET, HEAD"},
		{"no such endpoint", httpapi.Options{}, "GET", "/v1/nothing", "", "", 404, ""},
		{"a form post", httpapi.Options{}, "POST", "/v1/check", "application/x-www-form-urlencoded", "", 415, ""},
		{"a text/plain reset, as a web page can send", httpapi.Options{}, "POST", "/v1/reset", "text/plain", "", 415, ""},
		{"no media type", httpapi.Options{}, "POST", "/v1/check", "", "", 415, ""},
		{"token", httpapi.Options{Token: "s3cret"}, "POST", "/v1/check", "application/json", "Bearer s3cret", 200, ""},
		{"token, scheme in lower case", httpapi.Options{Token: "s3cret"}, "POST", "/v1/check", "application/json", "bearer s3cret", 200, ""},
		{"token, scheme in upper case", httpapi.Options{Token: "s3cret"}, "POST", "/v1/check", "application/json", "BEARER s3cret", 200, ""},
		{"wrong token", httpapi.Options{Token: "s3cret"}, "POST", "/v1/check", "application/json", "Bearer s3cre", 401, ""},
		{"token in another scheme", httpapi.Options{Token: "s3cret"}, "POST", "/v1/check", "application/json", "Basic s3cret", 401, ""},
		{"no token", httpapi.Options{Token: "s3cret"}, "POST", "/v1/check", "application/json", "", 401, ""},
		{"metrics open by default", httpapi.Options{Token: "s3cret"}, "GET", "/metrics", "", "", 200, ""},
		{"metrics protected", httpapi.Options{Token: "s3cret", ProtectMetrics: true}, "GET", "/metrics", "", "", 401, ""},
		{"metrics with the token", httpapi.Options{Token: "s3cret", ProtectMetrics: true}, "GET", "/metrics", "", "Bearer s3cret", 200, ""},
		{"health stays open", httpapi.Options{Token: "s3cret", ProtectMetrics: true}, "GET", "/healthz", "", "", 200, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := newHandler(t, &tt.opts)
			var body io.Reader
			if tt.method == "POST" {
				body = strings.NewReader(check)
			}
			req := httptest.NewRequest(tt.method, tt.path, body)
			if tt.ctype != "" {
				req.Header.Set("Content-Type", tt.ctype)
			}
			if tt.auth != "" {
				req.Header.Set("Authorization", tt.auth)
			}
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, req)
			if rec.Code != tt.status || rec.Header().Get("Allow") != tt.wantAllow {
				t.Errorf("%s %s: %d, Allow %q; want %d, Allow %q (%s)", tt.method, tt.path, rec.Code, rec.Header().Get("Allow"), tt.status, tt.wantAllow, rec.Body)
			}
		})
	}
}

// A body that stops arriving gets 408, and the answer does not show the
// connection's addresses.
func TestSlowBody(t *testing.T) {
	srv := httptest.NewUnstartedServer(newHandler(t, &httpapi.Options{}))
	srv.Config.ReadTimeout = 200 * time.Millisecond
	srv.Start()
	defer srv.Close()
	c, err := net.Dial("tcp", srv.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	io.WriteString(c, "POST /v1/check HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"rule\":")
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusRequestTimeout || strings.Contains(string(b), "127.0.0.1") {
		t.Errorf("slow body: %s %s", resp.Status, b)
	}
}

// FuzzAPI sends arbitrary methods, paths, media types and bodies: the API
// never panics, answers with a status it documents, and its body is JSON.
//
//	go test -run - -fuzz FuzzAPI ./internal/server/httpapi
func FuzzAPI(f *testing.F) {
	f.Add("POST", "/v1/check", "application/json", []byte(`{"rule":"example","key":"k","cost":3}`))
	f.Add("POST", "/v1/check/batch", "application/json", []byte(`{"checks":[{"rule":"example","key":"a"},{"rule":"x","key":""}]}`))
	f.Add("POST", "/v1/reset", "application/json", []byte(`{"rule":"example","key":"k"}`))
	f.Add("GET", "/v1/rules", "", []byte(nil))
	f.Add("GET", "/v1/explain?rule=example&key=%ff%00", "", []byte(nil))
	f.Add("PUT", "/v1/check", "text/plain", []byte("x"))
	f.Add("GET", "/v1/auth/example?key={method}:{header:X-A|path}&deny=429", "", []byte(nil))
	f.Add("POST", "/v1/check", "application/json; charset=utf-8", []byte(`{"rule":"example","key":"\u0000","cost":-9223372036854775808}`))
	h := newHandler(f, &httpapi.Options{})
	f.Fuzz(func(t *testing.T, method, path, ctype string, body []byte) {
		req, err := http.NewRequest(method, "http://floodgate"+path, bytes.NewReader(body))
		if err != nil || req.URL.Path == "" {
			return // not a request a client could send
		}
		req.Header.Set("Content-Type", ctype)
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		switch rec.Code {
		case 200, 204, 400, 404, 405, 413, 415, 431:
		case 403, 429: // a forward auth's denial, as deny= asks
			if !strings.HasPrefix(req.URL.Path, "/v1/auth") {
				t.Fatalf("%s %q: status %d", method, path, rec.Code)
			}
		case 301, 307, 308: // the mux cleans paths ("/./v1" to "/v1")
			return
		default:
			t.Fatalf("%s %q (%q, %q): status %d", method, path, ctype, body, rec.Code)
		}
		if rec.Code != 204 && method != "HEAD" && !json.Valid(rec.Body.Bytes()) {
			t.Fatalf("%s %q: body is not JSON: %q", method, path, rec.Body)
		}
	})
}
