package httplimit_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/floodgate/floodgate"
	"github.com/floodgate/floodgate/httplimit"
	"github.com/floodgate/floodgate/storetest"
)

// gateClock's Sleep says it sleeps on sleeping (when set), and returns
// when the test sends on ticks, or when its context ends.
type gateClock struct {
	ticks, sleeping chan struct{}
}

func (c *gateClock) Now() time.Time { return storetest.Base }
func (c *gateClock) Sleep(ctx context.Context, d time.Duration) error {
	if c.sleeping != nil {
		select {
		case c.sleeping <- struct{}{}:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	select {
	case <-c.ticks:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func concurrencyFixture(t *testing.T, n int64) (*storetest.Clock, *floodgate.Concurrency) {
	t.Helper()
	clock := storetest.NewClock(storetest.Base)
	st := floodgate.NewMemoryStore(&floodgate.MemoryOptions{Clock: clock, SweepInterval: -1})
	t.Cleanup(func() { st.Close() })
	c, err := floodgate.NewConcurrency(st, n, 10*time.Second, &floodgate.ConcurrencyOptions{Name: "inflight"})
	if err != nil {
		t.Fatal(err)
	}
	return clock, c
}

func byHeader(r *http.Request) (string, error) { return r.Header.Get("X-Key"), nil }

// Two requests hold the key's two slots; a third gets 429 with the
// Retry-After of the earliest permit; when one returns, its slot is
// free again.
func TestConcurrencyMiddleware(t *testing.T) {
	clock, c := concurrencyFixture(t, 2)
	gate := &gateClock{ticks: make(chan struct{})}
	entered, leave := make(chan struct{}), make(chan struct{})
	h := httplimit.NewConcurrency(c, &httplimit.ConcurrencyOptions{Key: byHeader, Clock: gate}).Handler(
		http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.URL.Path == "/slow" {
				entered <- struct{}{}
				<-leave
			}
			w.WriteHeader(http.StatusNoContent)
		}))
	do := func(path, key string) *httptest.ResponseRecorder {
		req := httptest.NewRequest("GET", path, nil)
		req.Header.Set("X-Key", key)
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		return rec
	}
	results := make(chan int, 2)
	for range 2 {
		go func() { results <- do("/slow", "k").Code }()
		<-entered
	}
	clock.Advance(4 * time.Second)
	rec := do("/fast", "k")
	if rec.Code != http.StatusTooManyRequests || rec.Header().Get("Retry-After") != "6" ||
		!strings.Contains(rec.Body.String(), `"violated-policy":"inflight"`) || !strings.Contains(rec.Body.String(), "2 of 2 requests in flight") {
		t.Fatalf("third request: %d %v %s", rec.Code, rec.Header(), rec.Body)
	}
	if rec := do("/fast", "other"); rec.Code != http.StatusNoContent {
		t.Fatalf("another key: %d", rec.Code)
	}
	leave <- struct{}{}
	if code := <-results; code != http.StatusNoContent {
		t.Fatalf("slow request: %d", code)
	}
	if rec := do("/fast", "k"); rec.Code != http.StatusNoContent {
		t.Fatalf("after a slot came back: %d %s", rec.Code, rec.Body)
	}
	leave <- struct{}{}
	<-results
	// Every slot is back.
	r, err := c.Acquire(context.Background(), "k")
	if err != nil || !r.Allowed || r.Held != 1 {
		t.Fatalf("after every request: %+v %v", r, err)
	}
}

// A long request's permit is extended while it runs; when an extend
// finds the permit gone, the handler's context ends with ErrPermitLost.
func TestConcurrencyMiddlewareExtends(t *testing.T) {
	clock, c := concurrencyFixture(t, 1)
	gate := &gateClock{ticks: make(chan struct{}), sleeping: make(chan struct{})}
	entered, cause := make(chan struct{}), make(chan error, 1)
	h := httplimit.NewConcurrency(c, &httplimit.ConcurrencyOptions{Key: byHeader, Clock: gate}).Handler(
		http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			entered <- struct{}{}
			<-r.Context().Done()
			cause <- context.Cause(r.Context())
		}))
	go func() {
		req := httptest.NewRequest("GET", "/stream", nil)
		req.Header.Set("X-Key", "k")
		h.ServeHTTP(httptest.NewRecorder(), req)
	}()
	<-entered
	ctx := context.Background()
	for range 3 { // 3 extends, 8s apart, each within the lease of 10s
		<-gate.sleeping
		clock.Advance(8 * time.Second)
		gate.ticks <- struct{}{}
	}
	<-gate.sleeping // the third extend is done
	if r, err := c.Acquire(ctx, "k"); err != nil || r.Allowed || r.RetryAfter != 10*time.Second {
		t.Fatalf("at 24s, the extended permit: %+v %v", r, err)
	}
	clock.Advance(11 * time.Second) // past the lease since the last extend
	gate.ticks <- struct{}{}
	if err := <-cause; !errors.Is(err, httplimit.ErrPermitLost) {
		t.Fatalf("handler's context ended with %v, want ErrPermitLost", err)
	}
}
