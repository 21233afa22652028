// Package arith is the integer arithmetic and the conversions that
// floodgate's algorithms and reports share: exact products and quotients,
// floor division, and microseconds to durations and coarser units. It is
// internal so that package core keeps only what a Store author needs.
package arith

import (
	"math"
	"math/bits"
	"time"
)

// The arithmetic rules every algorithm follows, in Go here and mirrored
// by the Lua code of the Redis store (redisstore/prelude.lua), whose
// functions have the same names:
//
//   - Time is an integer number of microseconds since the Unix epoch.
//   - A rate of R events per P microseconds is kept as the exact fraction
//     P/R: a point in time is a whole number of microseconds plus a
//     numerator below R (see core's stepBucket). Nothing is ever rounded while it is
//     stored, so no drift accumulates, whatever R and P are.
//   - Rounding happens only when a figure is reported, and always against
//     the caller: durations (retry-after, reset-after) round up to the next
//     microsecond, counts (remaining) round down. A client that waits the
//     reported time is never early; a reported count is never more than
//     what is really there.
//   - Every intermediate value stays below 2^53, so that Lua's doubles hold
//     it exactly. The bounds in core/spec.go guarantee it; MulDiv is the one
//     place where a product could exceed that, and it never forms it.

// maxExact is 2^52: every parameter, and every divisor given to MulDiv, is
// below it, so that sums of two such values stay exact in a double.
const maxExact = 1 << 52

// MulDiv returns q = floor(a*b/c) and r = a*b - q*c, exactly, for a, b >= 0
// and c > 0. The callers' bounds keep q below 2^63; should it ever not be,
// MulDiv saturates instead of panicking.
func MulDiv(a, b, c int64) (q, r int64) {
	hi, lo := bits.Mul64(uint64(a), uint64(b))
	if hi >= uint64(c) {
		return math.MaxInt64, 0
	}
	qq, rr := bits.Div64(hi, lo, uint64(c))
	if qq > math.MaxInt64 {
		return math.MaxInt64, 0
	}
	return int64(qq), int64(rr)
}

// FloorDiv returns floor(a/b) and the non-negative remainder, for b > 0.
// Unlike Go's / and %, it rounds towards minus infinity, which is what
// window alignment needs for times before the epoch.
func FloorDiv(a, b int64) (q, r int64) {
	q, r = a/b, a%b
	if r < 0 {
		q--
		r += b
	}
	return q, r
}

// Never is floodgate.Never, the largest Duration: the RetryAfter of a request
// that can never be allowed.
const Never = time.Duration(1<<63 - 1)

// Duration converts a verdict's microseconds to a Duration: a negative
// value (core.NeverMicros), or one too large, to Never.
func Duration(us int64) time.Duration {
	if us < 0 || us > int64(Never/time.Microsecond) {
		return Never
	}
	return time.Duration(us) * time.Microsecond
}

// RoundUp returns d in whole units, rounded up, the rule of every figure
// floodgate reports in coarser units than microseconds (Retry-After and
// RateLimit headers in seconds, CL.THROTTLE, milliseconds in JSON): a
// client that waits what it is told is never early. It returns 0 for
// d <= 0 and -1 for Never.
func RoundUp(d, unit time.Duration) int64 {
	switch {
	case d == Never:
		return -1
	case d <= 0:
		return 0
	}
	q := int64(d / unit)
	if d%unit != 0 {
		q++
	}
	return q
}
