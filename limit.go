package floodgate

import (
	"fmt"
	"strconv"
	"time"
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

// bucket reports whether the algorithm is one of the three that share the
// GCRA core (token bucket, leaky bucket and GCRA itself).
func (a Algorithm) bucket() bool {
	return a == AlgorithmTokenBucket || a == AlgorithmLeakyBucket || a == AlgorithmGCRA
}

// Calendar is a calendar unit for fixed windows aligned to local time.
type Calendar uint8

// The calendar units. Days start at midnight, weeks on Monday at midnight,
// months on the first at midnight, all in the window's time zone, so a day
// can last 23 or 25 hours across a daylight saving change.
const (
	Day Calendar = iota + 1
	Week
	Month
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
	MaxQuota = 1 << 40
	// MaxPeriod is the longest period or window, and the longest time a
	// bucket may take to refill from empty (burst * period / rate): 2^48
	// microseconds, about 8.9 years.
	MaxPeriod = time.Duration(1<<48) * time.Microsecond
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
	alg    Algorithm
	quota  int64 // the most one request may cost: burst, capacity, max_burst+1 or window limit
	rate   int64 // bucket family: events per period
	period int64 // microseconds: the bucket's period, or the window's length
	cal    Calendar
	loc    *time.Location
	name   string
	err    error

	// Bucket family: the emission interval period/rate as tq + tr/rate
	// microseconds, and the tolerance quota*period/rate as tauQ + tauR/rate.
	tq, tr     int64
	tauQ, tauR int64
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
		l := Limit{alg: AlgorithmGCRA}
		l.err = fmt.Errorf("%w: gcra max_burst must be between 0 and %d, got %d", ErrInvalidLimit, MaxQuota-1, maxBurst)
		return l
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
	l := Limit{alg: AlgorithmFixedWindow, quota: limit, name: ""}
	l.err = checkWindow(&l, limit, window)
	return l
}

// CalendarWindow returns a fixed window limit whose windows are calendar
// days, weeks or months in the time zone loc (UTC when loc is nil): "1000
// per day, resetting at midnight in Europe/Paris". Period reports the
// nominal length (24h, 168h, or 30 days for a month).
func CalendarWindow(limit int64, unit Calendar, loc *time.Location) Limit {
	if loc == nil {
		loc = time.UTC
	}
	l := Limit{alg: AlgorithmFixedWindow, quota: limit, cal: unit, loc: loc}
	var nominal time.Duration
	switch unit {
	case Day:
		nominal = 24 * time.Hour
	case Week:
		nominal = 7 * 24 * time.Hour
	case Month:
		nominal = 30 * 24 * time.Hour
	default:
		l.err = fmt.Errorf("%w: unknown calendar unit %d", ErrInvalidLimit, unit)
		return l
	}
	l.err = checkWindow(&l, limit, nominal)
	return l
}

// SlidingLog returns an exact sliding window limit: at most limit units of
// cost in any window of the given length ending now. It keeps the time of
// every admitted unit that is still in the window, so its memory grows with
// the limit (never beyond it).
func SlidingLog(limit int64, window time.Duration) Limit {
	l := Limit{alg: AlgorithmSlidingLog, quota: limit}
	l.err = checkWindow(&l, limit, window)
	return l
}

// SlidingWindow returns an approximate sliding window limit (the sliding
// window counter): it keeps the count of the current and the previous
// epoch-aligned window and estimates the count of the window ending now as
// previous * (part of the previous window still covered) + current. The
// estimate rounds up, so it never admits more than SlidingLog would when
// requests are spread evenly. Memory is constant per key.
func SlidingWindow(limit int64, window time.Duration) Limit {
	l := Limit{alg: AlgorithmSlidingWindow, quota: limit}
	l.err = checkWindow(&l, limit, window)
	return l
}

func newBucket(alg Algorithm, rate int64, period time.Duration, quota int64, quotaName string) Limit {
	l := Limit{alg: alg, quota: quota, rate: rate}
	switch {
	case rate < 1 || rate > MaxQuota:
		l.err = fmt.Errorf("%w: %s rate must be between 1 and %d per period, got %d", ErrInvalidLimit, alg, int64(MaxQuota), rate)
	case quota < 1 || quota > MaxQuota:
		l.err = fmt.Errorf("%w: %s %s must be between 1 and %d, got %d", ErrInvalidLimit, alg, quotaName, int64(MaxQuota), quota)
	default:
		l.err = checkPeriod(&l, period)
	}
	if l.err != nil {
		return l
	}
	l.tq, l.tr = mulDiv(1, l.period, l.rate)
	l.tauQ, l.tauR = mulDiv(l.quota, l.period, l.rate)
	if l.tauQ >= int64(MaxPeriod/time.Microsecond) {
		l.err = fmt.Errorf("%w: %s refills from empty in %s (%s * period / rate), more than the maximum %s",
			ErrInvalidLimit, alg, time.Duration(l.tauQ)*time.Microsecond, quotaName, MaxPeriod)
	}
	return l
}

func checkWindow(l *Limit, limit int64, window time.Duration) error {
	if limit < 1 || limit > MaxQuota {
		return fmt.Errorf("%w: %s limit must be between 1 and %d, got %d", ErrInvalidLimit, l.alg, int64(MaxQuota), limit)
	}
	return checkPeriod(l, window)
}

func checkPeriod(l *Limit, p time.Duration) error {
	switch {
	case p <= 0:
		return fmt.Errorf("%w: %s period must be positive, got %s", ErrInvalidLimit, l.alg, p)
	case p%time.Microsecond != 0:
		return fmt.Errorf("%w: %s period must be a whole number of microseconds, got %s", ErrInvalidLimit, l.alg, p)
	case p > MaxPeriod:
		return fmt.Errorf("%w: %s period must be at most %s, got %s", ErrInvalidLimit, l.alg, MaxPeriod, p)
	}
	l.period = int64(p / time.Microsecond)
	return nil
}

// Named returns a copy of l labelled name. The name identifies the limit
// in results, in RateLimit-Policy headers and in metrics ("burst",
// "daily"); it has no effect on decisions.
func (l Limit) Named(name string) Limit {
	l.name = name
	return l
}

// Validate returns nil when l is usable, or an error wrapping
// ErrInvalidLimit that says which parameter is wrong.
func (l Limit) Validate() error { return l.validate() }

// validate is Validate without copying the Limit, for the hot path.
func (l *Limit) validate() error {
	if l.err != nil {
		return l.err
	}
	if l.alg == 0 {
		return fmt.Errorf("%w: the zero Limit has no algorithm; build one with TokenBucket, GCRA, SlidingWindow, ...", ErrInvalidLimit)
	}
	return nil
}

// Algorithm returns the limit's algorithm.
func (l Limit) Algorithm() Algorithm { return l.alg }

// Name returns the label given by Named, or "".
func (l Limit) Name() string { return l.name }

// Quota returns the most that one request can cost and the most a fresh
// key admits at once: the token bucket's burst, the leaky bucket's
// capacity, GCRA's max_burst+1, or a window's limit. It is what results
// report as Limit.
func (l Limit) Quota() int64 { return l.quota }

// Rate returns how many units the limit restores per Period: the token
// bucket's rate, the leaky bucket's leak, GCRA's count, or a window's
// limit.
func (l Limit) Rate() int64 {
	if l.alg.bucket() {
		return l.rate
	}
	return l.quota
}

// Period returns the period over which Rate units are restored: the
// bucket's period or the window's length (nominal for calendar windows).
func (l Limit) Period() time.Duration { return time.Duration(l.period) * time.Microsecond }

// Window returns the fixed window that contains t: for FixedWindow the
// epoch-aligned window, for CalendarWindow the calendar day, week or month
// in the limit's time zone. For the other algorithms it returns t, t.
func (l Limit) Window(t time.Time) (start, end time.Time) {
	if l.alg != AlgorithmFixedWindow {
		return t, t
	}
	s, e := l.window(unixMicro(t))
	return time.UnixMicro(s), time.UnixMicro(e)
}

// Calendar returns the calendar unit and time zone of a calendar-aligned
// fixed window, or 0 and nil for every other limit.
func (l Limit) Calendar() (Calendar, *time.Location) { return l.cal, l.loc }

// String describes the limit, for logs and error messages:
// "token-bucket 10/1s burst 20".
func (l Limit) String() string {
	var s string
	switch {
	case l.alg.bucket():
		s = fmt.Sprintf("%s %d/%s burst %d", l.alg, l.rate, l.Period(), l.quota)
	case l.cal != 0:
		s = fmt.Sprintf("%s %d per %s (%s)", l.alg, l.quota, l.cal, l.loc)
	default:
		s = fmt.Sprintf("%s %d/%s", l.alg, l.quota, l.Period())
	}
	if l.name != "" {
		s = l.name + ": " + s
	}
	return s
}

// Share returns the 1/n share of l that one of n processes may admit on
// its own: the quota (burst, capacity or window limit) divided by n,
// rounded down but at least 1, and for the bucket algorithms the rate
// divided by n too (by stretching the period n times, which is exact). A
// fallback store gives its local limiter Share(instances) of each limit,
// so that n processes cut off from Redis admit about the global limit
// between them, not n times it. Share(1) returns l; n < 1 gives an invalid
// Limit.
func (l Limit) Share(n int64) Limit {
	if l.err != nil || n == 1 {
		return l
	}
	if n < 1 {
		bad := Limit{alg: l.alg, name: l.name}
		bad.err = fmt.Errorf("%w: share must be of 1 or more instances, got %d", ErrInvalidLimit, n)
		return bad
	}
	q := max(1, l.quota/n)
	var s Limit
	switch {
	case l.alg.bucket():
		if l.period <= int64(MaxPeriod/time.Microsecond)/n {
			s = newBucket(l.alg, l.rate, l.Period()*time.Duration(n), q, "quota")
		}
		if s.alg == 0 || s.err != nil {
			// The stretched period is out of range: divide the rate instead.
			s = newBucket(l.alg, max(1, l.rate/n), l.Period(), q, "quota")
		}
	case l.cal != 0:
		s = CalendarWindow(q, l.cal, l.loc)
	default:
		s = l
		s.quota = q
	}
	s.name = l.name
	return s
}
