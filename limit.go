package floodgate

import (
	"fmt"
	"strconv"
	"time"

	"github.com/floodgate/floodgate/core"
)

// Algorithm identifies a rate limiting algorithm. The zero value is no
// algorithm at all; a Limit with it is invalid.
type Algorithm uint8

// The algorithms. The package documentation compares them.
const (
	AlgorithmTokenBucket   Algorithm = iota + 1 // token bucket: rate per period, burst
	AlgorithmLeakyBucket                        // leaky bucket as a meter (funnel): capacity, leak rate
	AlgorithmGCRA                               // generic cell rate algorithm, redis-cell's CL.THROTTLE
	AlgorithmFixedWindow                        // fixed window counter, epoch or calendar aligned
	AlgorithmSlidingLog                         // sliding window log: exact, one timestamp per admitted unit
	AlgorithmSlidingWindow                      // sliding window counter: approximate, O(1) memory
)

var algorithmNames = [...]string{
	AlgorithmTokenBucket:   "token-bucket",
	AlgorithmLeakyBucket:   "leaky-bucket",
	AlgorithmGCRA:          "gcra",
	AlgorithmFixedWindow:   "fixed-window",
	AlgorithmSlidingLog:    "sliding-log",
	AlgorithmSlidingWindow: "sliding-window",
}

// String returns the algorithm's name as configuration files spell it:
// token-bucket, leaky-bucket, gcra, fixed-window, sliding-log or
// sliding-window.
func (a Algorithm) String() string {
	if int(a) < len(algorithmNames) && algorithmNames[a] != "" {
		return algorithmNames[a]
	}
	return "Algorithm(" + strconv.Itoa(int(a)) + ")"
}

// ParseAlgorithm returns the Algorithm whose String is s.
func ParseAlgorithm(s string) (Algorithm, error) {
	for i, name := range algorithmNames {
		if name != "" && name == s {
			return Algorithm(i), nil
		}
	}
	return 0, fmt.Errorf("%w: unknown algorithm %q", ErrInvalidLimit, s)
}

// kind returns the core kind that decides the algorithm.
func (a Algorithm) kind() core.Kind {
	switch a {
	case AlgorithmTokenBucket, AlgorithmLeakyBucket, AlgorithmGCRA:
		return core.Bucket
	case AlgorithmFixedWindow:
		return core.Fixed
	case AlgorithmSlidingWindow:
		return core.Sliding
	case AlgorithmSlidingLog:
		return core.Log
	}
	return 0
}

// Calendar is a calendar unit for fixed windows aligned to local time.
type Calendar uint8

// The calendar units. Days start at midnight, weeks on Monday at midnight,
// months on the first at midnight, all in the window's time zone, so a day
// can last 23 or 25 hours across a daylight saving change.
const (
	Day   = Calendar(core.Day)
	Week  = Calendar(core.Week)
	Month = Calendar(core.Month)
)

// String returns "day", "week" or "month".
func (c Calendar) String() string {
	switch c {
	case Day:
		return "day"
	case Week:
		return "week"
	case Month:
		return "month"
	}
	return "Calendar(" + strconv.Itoa(int(c)) + ")"
}

// The bounds on a Limit's parameters. They keep every value that the
// algorithms compute below 2^53, so that the Go code and the Lua scripts
// (whose numbers are doubles) compute the same exact integers.
const (
	// MaxQuota is the largest rate, burst, capacity or window limit: about
	// 1.1 trillion.
	MaxQuota = core.MaxQuota
	// MaxPeriod is the longest period or window, and the longest time a
	// bucket may take to refill from empty (burst * period / rate): 2^48
	// microseconds, about 8.9 years.
	MaxPeriod = core.MaxPeriod
	// MaxLogQuota is the largest SlidingLog limit, and the most that the
	// sliding logs of one set of limits may admit together: a sliding log
	// records every unit it admits, so its limit bounds the work of one
	// request. SlidingWindow takes larger limits.
	MaxLogQuota = core.MaxLogQuota
)

// Limit describes one rate limit: an algorithm and its parameters. Build
// one with TokenBucket, LeakyBucket, GCRA, FixedWindow, CalendarWindow,
// SlidingLog, SlidingWindow or the PerSecond, PerMinute and PerHour
// shorthands.
//
// A Limit is a small immutable value, safe to copy and to share between
// goroutines. Constructors never panic: an invalid parameter is recorded in
// the Limit and reported by Validate, by NewLimiter and by every store call
// that is given the Limit. The zero Limit is invalid.
type Limit struct {
	alg  Algorithm
	spec core.Spec // the compiled form, which stores decide with
	err  error
}

// TokenBucket returns a token bucket limit: a bucket of burst tokens,
// refilled at rate tokens per period, one token per unit of cost. A request
// of cost n passes when n tokens are in the bucket. Burst is the bucket's
// size, so a full bucket admits burst requests at once: this is what
// go-redis/redis_rate and golang.org/x/time/rate call burst.
//
// TokenBucket(10, time.Second, 20) admits 20 at once, then 10 per second.
// Rates below one per second are written with a longer period:
// TokenBucket(1, time.Hour, 5).
func TokenBucket(rate int64, period time.Duration, burst int64) Limit {
	return newBucket(AlgorithmTokenBucket, rate, period, burst, "burst")
}

// LeakyBucket returns a leaky bucket limit, in its meter form (the
// "funnel"): a funnel that holds capacity units and leaks leak units per
// period. A request of cost q passes when the funnel has q units of free
// space, and then fills it by q.
//
// The funnel's free space is exactly a token bucket's tokens, so
// LeakyBucket(c, l, p) decides exactly as TokenBucket(l, p, c): it is
// offered under the name users know. To delay requests instead of denying
// them (the queue form), use Limiter.Wait.
func LeakyBucket(capacity, leak int64, period time.Duration) Limit {
	return newBucket(AlgorithmLeakyBucket, leak, period, capacity, "capacity")
}

// GCRA returns a limit with the semantics of redis-cell's
// CL.THROTTLE key max_burst count period: count requests per period, with
// bursts of up to maxBurst requests beyond the steady rate, so that a fresh
// key admits maxBurst+1 requests at once. Its Quota is maxBurst+1, which is
// what CL.THROTTLE reports as the limit.
//
// GCRA(maxBurst, count, period) decides exactly as
// TokenBucket(count, period, maxBurst+1).
func GCRA(maxBurst, count int64, period time.Duration) Limit {
	if maxBurst < 0 || maxBurst >= MaxQuota {
		return Limit{alg: AlgorithmGCRA, err: fmt.Errorf("%w: gcra max_burst must be between 0 and %d, got %d", ErrInvalidLimit, MaxQuota-1, maxBurst)}
	}
	return newBucket(AlgorithmGCRA, count, period, maxBurst+1, "max_burst+1")
}

// PerSecond returns TokenBucket(n, time.Second, n): n requests per second,
// all n available at once.
func PerSecond(n int64) Limit { return TokenBucket(n, time.Second, n) }

// PerMinute returns TokenBucket(n, time.Minute, n).
func PerMinute(n int64) Limit { return TokenBucket(n, time.Minute, n) }

// PerHour returns TokenBucket(n, time.Hour, n).
func PerHour(n int64) Limit { return TokenBucket(n, time.Hour, n) }

// FixedWindow returns a fixed window limit: at most limit units of cost in
// each window of the given length. Windows are aligned to the Unix epoch
// (a one-minute window starts at every whole minute UTC), so every process
// and every store agrees where a window starts. A burst of up to 2*limit
// can pass across a window boundary; SlidingLog and SlidingWindow avoid it.
func FixedWindow(limit int64, window time.Duration) Limit {
	return newWindow(AlgorithmFixedWindow, limit, window)
}

// CalendarWindow returns a fixed window limit whose windows are calendar
// days, weeks or months in the time zone loc (UTC when loc is nil): "1000
// per day, resetting at midnight in Europe/Paris". Period reports the
// nominal length (24h, 168h, or 30 days for a month).
func CalendarWindow(limit int64, unit Calendar, loc *time.Location) Limit {
	spec, err := core.NewCalendarWindow(AlgorithmFixedWindow.String(), limit, core.Calendar(unit), loc)
	spec.Alg = uint8(AlgorithmFixedWindow)
	return Limit{alg: AlgorithmFixedWindow, spec: spec, err: err}
}

// SlidingLog returns an exact sliding window limit: at most limit units of
// cost in any window of the given length ending now. It keeps the time of
// every admitted unit that is still in the window, so its memory and the
// work of one request grow with the limit: limit must be at most
// MaxLogQuota (as must the sum of the sliding logs that one Limiter or
// override checks together). Use SlidingWindow for larger limits.
//
// A Charge takes a sliding log at most its limit into debt: it records
// only the units that keep the log within twice its limit.
func SlidingLog(limit int64, window time.Duration) Limit {
	return newWindow(AlgorithmSlidingLog, limit, window)
}

// SlidingWindow returns an approximate sliding window limit (the sliding
// window counter): it keeps the count of the current and the previous
// epoch-aligned window and estimates the count of the window ending now as
// previous * (part of the previous window still covered) + current. The
// estimate rounds up, so it never admits more than SlidingLog would when
// requests are spread evenly. Memory is constant per key.
func SlidingWindow(limit int64, window time.Duration) Limit {
	return newWindow(AlgorithmSlidingWindow, limit, window)
}

func newBucket(alg Algorithm, rate int64, period time.Duration, quota int64, quotaName string) Limit {
	spec, err := core.NewBucket(alg.String(), rate, period, quota, quotaName)
	spec.Alg = uint8(alg)
	return Limit{alg: alg, spec: spec, err: err}
}

func newWindow(alg Algorithm, limit int64, window time.Duration) Limit {
	spec, err := core.NewWindow(alg.kind(), alg.String(), limit, window)
	spec.Alg = uint8(alg)
	return Limit{alg: alg, spec: spec, err: err}
}

// Named returns a copy of l labelled name. The name identifies the limit
// in results, in RateLimit-Policy headers and in metrics ("burst",
// "daily"); it has no effect on decisions.
func (l Limit) Named(name string) Limit {
	l.spec.Name = name
	return l
}

// Validate returns nil when l is usable, or an error wrapping
// ErrInvalidLimit that says which parameter is wrong.
func (l Limit) Validate() error {
	if l.err != nil {
		return l.err
	}
	if l.alg == 0 {
		return l.spec.Validate() // the zero Spec's error: no algorithm
	}
	return nil
}

// Algorithm returns the limit's algorithm.
func (l Limit) Algorithm() Algorithm { return l.alg }

// Name returns the label given by Named, or "".
func (l Limit) Name() string { return l.spec.Name }

// Quota returns the most that one request can cost and the most a fresh
// key admits at once: the token bucket's burst, the leaky bucket's
// capacity, GCRA's max_burst+1, or a window's limit. It is what results
// report as Quota.
func (l Limit) Quota() int64 { return l.spec.Quota }

// Rate returns how many units the limit restores per Period: the token
// bucket's rate, the leaky bucket's leak, GCRA's count, or a window's
// limit.
func (l Limit) Rate() int64 { return l.spec.Rate }

// Period returns the period over which Rate units are restored: the
// bucket's period or the window's length (nominal for calendar windows).
func (l Limit) Period() time.Duration { return time.Duration(l.spec.Period) * time.Microsecond }

// Span returns the time over which the limit admits its Quota: a window's
// length (nominal for calendar windows), or for the bucket algorithms the
// time an empty bucket takes to refill, Quota × Period / Rate rounded up to
// the microsecond. Quota per Span is then both the burst and the long-run
// rate; it is the w of a RateLimit-Policy header field.
func (l Limit) Span() time.Duration {
	if l.spec.Kind != core.Bucket {
		return l.Period()
	}
	us := l.spec.TauQ
	if l.spec.TauR > 0 {
		us++
	}
	return time.Duration(us) * time.Microsecond
}

// Calendar returns the calendar unit and time zone of a calendar-aligned
// fixed window, or 0 and nil for every other limit.
func (l Limit) Calendar() (Calendar, *time.Location) {
	return Calendar(l.spec.Calendar), l.spec.Location
}

// String describes the limit, for logs and error messages:
// "token-bucket 10/1s burst 20".
func (l Limit) String() string {
	var s string
	switch cal, loc := l.Calendar(); {
	case l.alg.kind() == core.Bucket:
		s = fmt.Sprintf("%s %d/%s burst %d", l.alg, l.spec.Rate, l.Period(), l.spec.Quota)
	case cal != 0:
		s = fmt.Sprintf("%s %d per %s (%s)", l.alg, l.spec.Quota, cal, loc)
	default:
		s = fmt.Sprintf("%s %d/%s", l.alg, l.spec.Quota, l.Period())
	}
	if l.spec.Name != "" {
		s = l.spec.Name + ": " + s
	}
	return s
}

// limitOf returns the Limit whose compiled form is sp, a Spec that a store
// read back (an override): its algorithm is sp.Alg, or, when that is
// unknown, the first of its kind.
func limitOf(sp core.Spec) Limit {
	alg := Algorithm(sp.Alg)
	if alg.kind() != sp.Kind {
		for a := AlgorithmTokenBucket; a <= AlgorithmSlidingWindow; a++ {
			if a.kind() == sp.Kind {
				alg = a
				break
			}
		}
	}
	sp.Alg = uint8(alg)
	return Limit{alg: alg, spec: sp, err: sp.Validate()}
}
