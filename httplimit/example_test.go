package httplimit_test

import (
	"fmt"
	"net/http"
	"net/http/httptest"

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
