// Package lib holds nothing itself: its subdirectories are small helpers
// with no knowledge of floodgate serve, used by the library (the root
// package, fallback, httplimit, grpclimit) and by the server alike:
//
//	arith      exact integer arithmetic and the rounding of durations
//	clientip   a request's client address behind trusted proxies
//	gcfloor    a floor under the garbage collector's target heap
//	headers    the RateLimit header fields, for HTTP and gRPC
//	httpjson   JSON bodies over HTTP: UTF-8 check, problem answers
//	lograte    one log line an interval, with a count of those held back
//	permithold a concurrency permit extended while a request runs, then released
//	slicepool  reuse of the slices a call needs only while it runs
//	storekit   what floodgate's stores share beyond package core: input
//	           checks, all-or-nothing groups, carries, permit ids
package lib
