// Command quickstart shows floodgate on its embedded in-memory store: a
// limit of 5 requests per second with bursts of 5, several limits on one
// key, and Wait.
//
//	go run ./examples/quickstart
package main

import (
	"context"
	"fmt"
	"log"
	"time"

	"github.com/floodgate/floodgate"
)

func main() {
	ctx := context.Background()

	// 5 per second, all 5 available at once.
	lim, err := floodgate.New(floodgate.PerSecond(5))
	if err != nil {
		log.Fatal(err)
	}
	defer lim.Close()

	fmt.Println("7 requests at once on one key, PerSecond(5):")
	for i := 1; i <= 7; i++ {
		r, err := lim.Allow(ctx, "user:42")
		if err != nil {
			log.Fatal(err) // the store failed or the input is invalid
		}
		fmt.Printf("  request %d: allowed=%-5v remaining=%d retry_after=%s reset_after=%s\n",
			i, r.Allowed, r.Remaining, r.RetryAfter, r.ResetAfter)
	}

	// Wait blocks until the request passes (about 200ms here).
	start := time.Now()
	if err := lim.Wait(ctx, "user:42"); err != nil {
		log.Fatal(err)
	}
	fmt.Printf("Wait for one more: passed after %s\n", time.Since(start).Round(10*time.Millisecond))

	// Two limits checked as one: 2 per second and 3 per minute.
	both, err := floodgate.New(
		floodgate.TokenBucket(2, time.Second, 2).Named("second"),
		floodgate.SlidingLog(3, time.Minute).Named("minute"),
	)
	if err != nil {
		log.Fatal(err)
	}
	defer both.Close()
	fmt.Println("2/s and 3/min on one key, a request every 600ms:")
	for i := 1; i <= 5; i++ {
		r, err := both.Allow(ctx, "api-key:abc")
		if err != nil {
			log.Fatal(err)
		}
		name := both.Limits()[r.Index].Name()
		fmt.Printf("  request %d: allowed=%-5v closest limit=%s remaining=%d retry_after=%s\n",
			i, r.Allowed, name, r.Remaining, r.RetryAfter.Round(time.Millisecond))
		time.Sleep(600 * time.Millisecond)
	}
}
