// Package floodgate is a rate limiter for one process or many: the same
// limits, decided in memory or shared through Redis, with exact integer
// arithmetic and the same results on every store.
//
// # Quick start
//
//	lim, err := floodgate.New(floodgate.PerSecond(10))  // in-memory store
//	...
//	res, err := lim.Allow(ctx, "user:42")
//	if err != nil { ... }          // the store failed or the input is invalid
//	if !res.Allowed { ... }        // denied: retry after res.RetryAfter
//
// # Choosing an algorithm
//
//	Constructor                           Behaviour                                       Memory per key
//	TokenBucket(rate, period, burst)      bursts up to burst, then rate per period        O(1)
//	LeakyBucket(capacity, leak, period)   the same, as a funnel that leaks                O(1)
//	GCRA(maxBurst, count, period)         redis-cell's CL.THROTTLE: limit = maxBurst+1    O(1)
//	FixedWindow(limit, window)            limit per epoch-aligned window                  O(1)
//	CalendarWindow(limit, Day, loc)       limit per calendar day/week/month in loc        O(1)
//	SlidingLog(limit, window)             exactly limit in any window ending now          O(limit)
//	SlidingWindow(limit, window)          about limit in any window ending now            O(1)
//
// Pick TokenBucket for API rate limits: it allows short bursts and a steady
// rate, needs one value per key and tells a client precisely when to
// retry. Pick a fixed window for quotas that users read on a calendar
// ("1000 per day"), SlidingLog when the limit is small and must be exact
// over any window ("5 password attempts in any 15 minutes"; at most
// MaxLogQuota), SlidingWindow for large limits over a moving window.
//
// Periods may be of any length from a microsecond to MaxPeriod (500ms,
// 30s, 5m, 24h, 720h); rates below one per second are a count over a
// longer period (TokenBucket(1, time.Hour, 5)); rates up to a million per
// second and more are exact, because a bucket's time is kept as a fraction
// and never rounded (see "Arithmetic" below).
//
// # What burst means
//
// Different libraries count burst differently; floodgate's Quota is always
// "the most admitted at once by a fresh key":
//
//   - TokenBucket's burst is the bucket's size, as in go-redis/redis_rate
//     (Limit.Burst) and golang.org/x/time/rate (NewLimiter's b):
//     redis_rate's PerSecond(10) is floodgate's PerSecond(10), that is
//     TokenBucket(10, time.Second, 10).
//   - GCRA's maxBurst is redis-cell's max_burst: a fresh key admits
//     maxBurst+1 requests, which CL.THROTTLE reports as the limit.
//     GCRA(b, c, p) decides exactly as TokenBucket(c, p, b+1).
//   - LeakyBucket's capacity is the funnel's size: LeakyBucket(c, l, p)
//     decides exactly as TokenBucket(l, p, c).
//   - For the windows, the limit is both the quota and the rate.
//
// A request may cost more than 1 (AllowN, WaitN); a cost larger than Quota
// can never pass and is denied with RetryAfter Never, and WaitN fails at
// once with ErrCostTooHigh. A cost of 0 peeks (Peek).
//
// # Choosing a store
//
// New uses a MemoryStore: nothing to install, one process. To share limits
// between processes, create a store with package redisstore and pass it to
// NewLimiter; every decision is then decided atomically by a Lua script on
// Redis, timed by the Redis server's clock, and concurrent decisions share
// script calls. Wrap it in a fallback.Store (package fallback) so that a
// Redis outage is answered by a local limiter, or by a fail-open or
// fail-closed policy, instead of errors.
//
// NewLimiter validates its limits and has the store prepare them once
// (Store.Prepare); each decision then only decides. Package core holds
// what every store decides with, and documents how to write a Store;
// package storetest is the conformance suite every Store passes.
//
// # Layout
//
//	floodgate          limits, Limiter, Result, the memory store (this package)
//	floodgate/core     algorithms, exact arithmetic, validation: for store authors
//	floodgate/redisstore, floodgate/fallback    the Redis store; surviving its failures
//	floodgate/httplimit, floodgate/grpclimit    net/http middleware; gRPC interceptors
//	floodgate/storetest                         the conformance suite
//	cmd/floodgate      floodgate serve: HTTP/JSON and the Redis protocol
//
// # Options
//
// Every package is configured the same way: a constructor takes what it
// needs and a pointer to an Options struct (nil for the defaults) whose
// zero fields mean "the default": NewLimiter(store, limits, &Options{...}),
// NewMemoryStore(&MemoryOptions{...}), redisstore.New(client,
// &redisstore.Options{...}). One struct lists every setting in one place,
// is filled as easily from flags or a file as in code, and grows without
// breaking callers.
//
// # Surfaces
//
// Package httplimit is net/http middleware with the RateLimit header
// fields; package grpclimit gives gRPC interceptors; the floodgate command
// (cmd/floodgate) serves limits over HTTP/JSON and the Redis protocol
// (CL.THROTTLE) to programs in any language.
//
// # Several limits on one key
//
// New(PerSecond(10), PerHour(1000)) checks both limits as one: a request
// passes only if every limit admits it, and then all are charged; if any
// denies, none is. Result.Index and Result.Name say which limit the Result
// describes (the denying one, or the one closest to denying).
//
// # Arithmetic
//
// Time is integer microseconds since the Unix epoch; no float ever holds a
// time. A bucket's emission interval period/rate is kept as an exact
// fraction, so no drift accumulates whatever the rate. Reported durations
// round up to the next microsecond and reported counts round down, so a
// client that waits RetryAfter is never early and Remaining never promises
// capacity that is not there. Every value stays below 2^53, so the Lua
// scripts of the Redis store compute the very same integers. Time going
// backwards never grants extra capacity.
package floodgate
