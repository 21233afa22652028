package httplimit_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"time"

	"github.com/floodgate/floodgate"
	"github.com/floodgate/floodgate/httplimit"
)

// Limit every client IP to 2 requests per minute, trusting the
// X-Forwarded-For of the load balancers in 10.0.0.0/8 only.
func ExampleNew() {
	lim, _ := floodgate.New(floodgate.PerMinute(2).Named("per-minute"))
	defer lim.Close()
	proxies, _ := httplimit.TrustedProxies("10.0.0.0/8")
	mw := httplimit.New(lim, &httplimit.Options{Key: httplimit.ClientIP(proxies...)})

	hello := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { fmt.Fprint(w, "hello") })
	h := mw.Handler(hello)

	for range 3 {
		req := httptest.NewRequest("GET", "/", nil)
		req.RemoteAddr = "10.1.2.3:40000" // the load balancer
		req.Header.Set("X-Forwarded-For", "203.0.113.9")
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		fmt.Println(rec.Code, rec.Header().Get("RateLimit"))
	}
	// Output:
	// 200 "per-minute";r=1;t=30
	// 200 "per-minute";r=0;t=60
	// 429 "per-minute";r=0;t=30
}

// Limit each API key to 10,000 LLM tokens a minute. The cost of a reply is
// known only once it is generated: charge an estimate of 500 up front, and
// let the handler report the real count, which the middleware settles by
// refunding the difference or charging the rest, into debt if need be.
func ExampleSetCost() {
	lim, _ := floodgate.New(floodgate.TokenBucket(10000, time.Minute, 10000).Named("tokens"))
	defer lim.Close()
	mw := httplimit.New(lim, &httplimit.Options{
		Key:    func(r *http.Request) (string, error) { return r.Header.Get("X-API-Key"), nil },
		Cost:   func(*http.Request) int64 { return 500 },
		Settle: true,
	})
	complete := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		used := int64(1800) // the model's reply took 1,800 tokens
		httplimit.SetCost(r, used)
		fmt.Fprint(w, "...")
	})
	h := mw.Handler(complete)

	req := httptest.NewRequest("POST", "/v1/complete", nil)
	req.Header.Set("X-API-Key", "tenant-42")
	h.ServeHTTP(httptest.NewRecorder(), req)
	r, _ := lim.Peek(context.Background(), "tenant-42")
	fmt.Println(r.Remaining)
	// Output:
	// 8200
}
