package floodgate_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/floodgate/floodgate"
	"github.com/floodgate/floodgate/storetest"
)

// A limit of 10 per second with bursts of 10, on the in-memory store.
func ExampleNew() {
	lim, err := floodgate.New(floodgate.PerSecond(10))
	if err != nil {
		panic(err)
	}
	defer lim.Close()

	res, err := lim.Allow(context.Background(), "user:42")
	if err != nil {
		panic(err) // the store failed or the key is invalid; a denial is not an error
	}
	fmt.Println("allowed", res.Allowed, "remaining", res.Remaining)
	// Output: allowed true remaining 9
}

// Two limits on one key, checked as one: 2 per second and 3 per hour.
func ExampleNewLimiter() {
	clock := storetest.NewClock(time.Date(2026, 11, 22, 10, 0, 0, 0, time.UTC))
	store := floodgate.NewMemoryStore(&floodgate.MemoryOptions{Clock: clock})
	defer store.Close()
	lim, err := floodgate.NewLimiter(store, []floodgate.Limit{
		floodgate.TokenBucket(2, time.Second, 2).Named("second"),
		floodgate.FixedWindow(3, time.Hour).Named("hour"),
	}, &floodgate.Options{Clock: clock})
	if err != nil {
		panic(err)
	}
	for i := 0; i < 4; i++ {
		res, _ := lim.Allow(context.Background(), "api-key:abc")
		fmt.Printf("allowed=%v by %q remaining=%d retry=%s\n",
			res.Allowed, res.Name, res.Remaining, res.RetryAfter)
		clock.Advance(time.Second)
	}
	// Output:
	// allowed=true by "second" remaining=1 retry=0s
	// allowed=true by "second" remaining=1 retry=0s
	// allowed=true by "hour" remaining=0 retry=0s
	// allowed=false by "hour" remaining=0 retry=59m57s
}

// redis-cell's CL.THROTTLE user123 15 30 60 on a fresh key replies
// 0 16 15 -1 2.
func ExampleGCRA() {
	lim, _ := floodgate.New(floodgate.GCRA(15, 30, time.Minute))
	defer lim.Close()
	res, _ := lim.Allow(context.Background(), "user123")
	fmt.Println(res.Allowed, res.Quota, res.Remaining, res.ResetAfter.Round(time.Second))
	// Output: true 16 15 2s
}

// WaitN blocks until the request passes, or fails at once when it never
// can.
func ExampleLimiter_WaitN() {
	lim, _ := floodgate.New(floodgate.TokenBucket(1, time.Second, 1))
	defer lim.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	fmt.Println(lim.Wait(ctx, "k"))
	err := lim.WaitN(ctx, "k", 1) // 1s away; the deadline is 100ms away
	fmt.Println(errors.Is(err, floodgate.ErrDeadline))
	err = lim.WaitN(ctx, "k", 2) // more than the burst: never
	fmt.Println(errors.Is(err, floodgate.ErrCostTooHigh))
	// Output:
	// <nil>
	// true
	// true
}

// One API call that counts against a tenant's quota and a user's rate,
// all or nothing: when the user is over their rate, the tenant's quota is
// not charged.
func ExampleAllowGroup() {
	clock := storetest.NewClock(time.Date(2026, 11, 22, 10, 0, 0, 0, time.UTC))
	store := floodgate.NewMemoryStore(&floodgate.MemoryOptions{Clock: clock})
	defer store.Close()
	tenants, _ := floodgate.NewLimiter(store, []floodgate.Limit{floodgate.FixedWindow(1000, time.Hour)}, nil)
	users, _ := floodgate.NewLimiter(store, []floodgate.Limit{floodgate.PerSecond(1)}, nil)

	for range 2 {
		reqs := []floodgate.Request{
			{Limiter: tenants, Key: "tenant:7", N: 1},
			{Limiter: users, Key: "user:42", N: 1},
		}
		if err := floodgate.AllowGroup(context.Background(), reqs, true); err != nil {
			panic(err)
		}
		fmt.Println("tenant", reqs[0].Result.Allowed, reqs[0].Result.Remaining, "user", reqs[1].Result.Allowed)
	}
	// Output:
	// tenant true 999 user true
	// tenant false 999 user false
}

// bucket4j's example: a key with 40 of 100 left is raised to 200. Under
// the Additive strategy it keeps the 60 it used and has 140 left; taking
// the override back proportionally leaves it 70 of 100.
func ExampleLimiter_SetOverride() {
	clock := storetest.NewClock(time.Date(2026, 11, 24, 10, 0, 0, 0, time.UTC))
	store := floodgate.NewMemoryStore(&floodgate.MemoryOptions{Clock: clock})
	defer store.Close()
	lim, err := floodgate.NewLimiter(store, []floodgate.Limit{floodgate.FixedWindow(100, time.Hour)}, &floodgate.Options{Clock: clock})
	if err != nil {
		panic(err)
	}
	ctx := context.Background()
	res, _ := lim.AllowN(ctx, "tenant:42", 60)
	fmt.Println("left", res.Remaining, "of", res.Quota)

	premium := floodgate.Override{Limits: []floodgate.Limit{floodgate.FixedWindow(200, time.Hour)}}
	if err := lim.SetOverride(ctx, "tenant:42", premium, floodgate.Additive); err != nil {
		panic(err) // an invalid limit or key, or the store failed: nothing changed
	}
	res, _ = lim.Peek(ctx, "tenant:42")
	fmt.Println("left", res.Remaining, "of", res.Quota, "overridden", res.Overridden)

	if err := lim.DeleteOverride(ctx, "tenant:42", floodgate.Proportional); err != nil {
		panic(err)
	}
	res, _ = lim.Peek(ctx, "tenant:42")
	fmt.Println("left", res.Remaining, "of", res.Quota, "overridden", res.Overridden)
	// Output:
	// left 40 of 100
	// left 140 of 200 overridden true
	// left 70 of 100 overridden false
}
