package core

import (
	"github.com/floodgate/floodgate/internal/lib/arith"

	"fmt"
	"math"
	"strconv"
	"time"
)

// Kind groups the algorithms by the shape of their state; it is all that
// Step needs to know of an algorithm. The token bucket, the leaky bucket
// and GCRA are one kind: they decide alike and differ only in how their
// parameters are named.
type Kind uint8

// The kinds. The zero Kind is no algorithm.
const (
	Bucket  Kind = iota + 1 // token bucket, leaky bucket, GCRA: a theoretical arrival time
	Fixed                   // fixed window counter, epoch or calendar aligned: window and count
	Sliding                 // sliding window counter: window, previous and current counts
	Log                     // sliding window log: the admitted units' times
)

// String returns "bucket", "fixed", "sliding" or "log".
func (k Kind) String() string {
	switch k {
	case Bucket:
		return "bucket"
	case Fixed:
		return "fixed"
	case Sliding:
		return "sliding"
	case Log:
		return "log"
	}
	return "Kind(" + strconv.Itoa(int(k)) + ")"
}

// Calendar is a calendar unit of a fixed window aligned to local time: Day,
// Week or Month; 0 for a window aligned to the Unix epoch.
type Calendar uint8

// The calendar units. Days start at midnight, weeks on Monday at midnight,
// months on the first at midnight, all in the window's time zone.
const (
	Day Calendar = iota + 1
	Week
	Month
)

// The bounds on a limit's parameters. They keep every value that the
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
	// MaxLogQuota is the largest sliding log limit, and the most that the
	// sliding logs of one set of limits may admit together. A sliding log
	// keeps a record of every unit it admits (in Redis, a sorted set
	// member each), so its limit bounds the work of one request and the
	// memory of one key; a larger limit is the sliding window counter's.
	MaxLogQuota = 250
)

const maxPeriodMicros = int64(MaxPeriod / time.Microsecond)

// Spec is one limit compiled for deciding: validated, in microseconds,
// with what every decision would otherwise recompute worked out once.
// Build one with NewBucket, NewWindow or NewCalendarWindow (package
// floodgate's Limit constructors do), never as a literal: Validate
// rejects a Spec whose derived fields do not match its parameters.
//
// A Spec is an immutable value, safe to copy and share.
type Spec struct {
	Kind Kind
	// Name labels the limit in results, headers and metrics; it has no
	// effect on decisions.
	Name string
	// Alg is the number of the algorithm (package floodgate's Algorithm)
	// that the limit was built as, so that a Spec read back from a store
	// (an override) says "gcra" rather than "bucket"; 0 when unknown. It
	// has no effect on decisions.
	Alg uint8
	// Quota is the most one request may cost and the most a fresh key
	// admits at once: a bucket's burst (capacity, max_burst+1), a window's
	// limit.
	Quota int64
	// Rate is how many units a bucket restores per Period; for the windows
	// it equals Quota.
	Rate int64
	// Period is the bucket's period or the window's length, in µs
	// (nominal for calendar windows).
	Period int64
	// Calendar and Location align a fixed window to calendar days, weeks
	// or months in a time zone; Calendar is 0 for every other limit.
	Calendar Calendar
	Location *time.Location

	// For a bucket, the emission interval T = Period/Rate is TQ + TR/Rate
	// µs, and the tolerance τ = Quota*Period/Rate is TauQ + TauR/Rate µs;
	// all are 0 for the windows.
	TQ, TR     int64
	TauQ, TauR int64
}

// NewBucket returns the Spec of a bucket that holds quota units and
// restores rate units per period. what names the algorithm and quotaName
// the quota in error messages ("token-bucket", "burst"). The error wraps
// ErrInvalidLimit.
func NewBucket(what string, rate int64, period time.Duration, quota int64, quotaName string) (Spec, error) {
	s := Spec{Kind: Bucket, Quota: quota, Rate: rate}
	switch {
	case rate < 1 || rate > MaxQuota:
		return Spec{}, fmt.Errorf("%w: %s rate must be between 1 and %d per period, got %d", ErrInvalidLimit, what, int64(MaxQuota), rate)
	case quota < 1 || quota > MaxQuota:
		return Spec{}, fmt.Errorf("%w: %s %s must be between 1 and %d, got %d", ErrInvalidLimit, what, quotaName, int64(MaxQuota), quota)
	}
	p, err := checkPeriod(what, period)
	if err != nil {
		return Spec{}, err
	}
	s.Period = p
	s.TQ, s.TR = arith.MulDiv(1, s.Period, s.Rate)
	s.TauQ, s.TauR = arith.MulDiv(s.Quota, s.Period, s.Rate)
	if s.TauQ >= maxPeriodMicros {
		refill := "more than " + time.Duration(math.MaxInt64).String() // beyond a Duration
		if s.TauQ <= math.MaxInt64/int64(time.Microsecond) {
			refill = (time.Duration(s.TauQ) * time.Microsecond).String()
		}
		return Spec{}, fmt.Errorf("%w: %s refills from empty in %s (%s * period / rate), more than the maximum %s",
			ErrInvalidLimit, what, refill, quotaName, MaxPeriod)
	}
	return s, nil
}

// NewWindow returns the Spec of a window limit of kind Fixed (aligned to
// the Unix epoch), Sliding or Log: at most limit units per window. what
// names the algorithm in error messages. The error wraps ErrInvalidLimit.
func NewWindow(kind Kind, what string, limit int64, window time.Duration) (Spec, error) {
	if kind != Fixed && kind != Sliding && kind != Log {
		return Spec{}, fmt.Errorf("%w: %s is not a window kind", ErrInvalidLimit, kind)
	}
	if err := checkQuota(what, limit); err != nil {
		return Spec{}, err
	}
	if kind == Log && limit > MaxLogQuota {
		return Spec{}, fmt.Errorf("%w: %s limit must be at most %d, got %d: a sliding log records every unit it admits; "+
			"use sliding-window (the sliding window counter) for a larger limit", ErrInvalidLimit, what, MaxLogQuota, limit)
	}
	p, err := checkPeriod(what, window)
	if err != nil {
		return Spec{}, err
	}
	return Spec{Kind: kind, Quota: limit, Rate: limit, Period: p}, nil
}

// NewCalendarWindow returns the Spec of a fixed window limit whose windows
// are calendar days, weeks or months in loc (UTC when nil). Its Period is
// the nominal length: 24h, 168h, or 30 days for a month.
func NewCalendarWindow(what string, limit int64, unit Calendar, loc *time.Location) (Spec, error) {
	if loc == nil {
		loc = time.UTC
	}
	var nominal time.Duration
	switch unit {
	case Day:
		nominal = 24 * time.Hour
	case Week:
		nominal = 7 * 24 * time.Hour
	case Month:
		nominal = 30 * 24 * time.Hour
	default:
		return Spec{}, fmt.Errorf("%w: unknown calendar unit %d", ErrInvalidLimit, unit)
	}
	s, err := NewWindow(Fixed, what, limit, nominal)
	s.Calendar, s.Location = unit, loc
	return s, err
}

func checkQuota(what string, limit int64) error {
	if limit < 1 || limit > MaxQuota {
		return fmt.Errorf("%w: %s limit must be between 1 and %d, got %d", ErrInvalidLimit, what, int64(MaxQuota), limit)
	}
	return nil
}

func checkPeriod(what string, p time.Duration) (int64, error) {
	switch {
	case p <= 0:
		return 0, fmt.Errorf("%w: %s period must be positive, got %s", ErrInvalidLimit, what, p)
	case p%time.Microsecond != 0:
		return 0, fmt.Errorf("%w: %s period must be a whole number of microseconds, got %s", ErrInvalidLimit, what, p)
	case p > MaxPeriod:
		return 0, fmt.Errorf("%w: %s period must be at most %s, got %s", ErrInvalidLimit, what, MaxPeriod, p)
	}
	return int64(p / time.Microsecond), nil
}

// Validate returns nil when s is a Spec that the constructors could have
// returned, and an error wrapping ErrInvalidLimit otherwise. Store.Prepare
// calls it on every Spec, so that a Spec built by hand cannot make Step
// divide by zero or leave the exact range.
func (s *Spec) Validate() error {
	var want Spec
	var err error
	switch {
	case s.Kind == Bucket:
		want, err = NewBucket("bucket", s.Rate, time.Duration(s.Period)*time.Microsecond, s.Quota, "quota")
	case s.Kind == Fixed && s.Calendar != 0:
		want, err = NewCalendarWindow("fixed window", s.Quota, s.Calendar, s.Location)
	case s.Kind >= Fixed && s.Kind <= Log:
		want, err = NewWindow(s.Kind, s.Kind.String()+" window", s.Quota, time.Duration(s.Period)*time.Microsecond)
	default:
		return fmt.Errorf("%w: the zero Limit has no algorithm; build one with a constructor such as TokenBucket or GCRA", ErrInvalidLimit)
	}
	if err != nil {
		return err
	}
	want.Name, want.Alg = s.Name, s.Alg
	if s.Period > maxPeriodMicros || want != *s {
		return fmt.Errorf("%w: %s spec was not built by its constructor", ErrInvalidLimit, s.Kind)
	}
	return nil
}

// Share returns the 1/n share of s that one of n processes may admit on
// its own: the quota divided by n, rounded down but at least 1, and for a
// bucket the rate divided by n too (by stretching the period n times,
// which is exact, or, when that is out of range, by dividing the rate). A
// fallback store's local limiter applies Share(instances) of each limit,
// so that n processes cut off from Redis admit about the global limit
// between them. Share(1) returns s.
func (s Spec) Share(n int64) (Spec, error) {
	if n == 1 {
		return s, nil
	}
	if n < 1 {
		return Spec{}, fmt.Errorf("%w: share must be of 1 or more instances, got %d", ErrInvalidLimit, n)
	}
	q := max(1, s.Quota/n)
	var out Spec
	var err error
	switch {
	case s.Kind == Bucket:
		err = ErrInvalidLimit
		if s.Period <= maxPeriodMicros/n {
			out, err = NewBucket("bucket", s.Rate, time.Duration(s.Period*n)*time.Microsecond, q, "quota")
		}
		if err != nil {
			out, err = NewBucket("bucket", max(1, s.Rate/n), time.Duration(s.Period)*time.Microsecond, q, "quota")
		}
	case s.Calendar != 0:
		out, err = NewCalendarWindow("fixed-window", q, s.Calendar, s.Location)
	default:
		out, err = NewWindow(s.Kind, s.Kind.String()+" window", q, time.Duration(s.Period)*time.Microsecond)
	}
	out.Name, out.Alg = s.Name, s.Alg
	return out, err
}

// Window returns the fixed window [start, end) that contains t, in µs:
// the epoch-aligned window of Period, or the calendar day, week or month
// in Location.
func (s *Spec) Window(t int64) (start, end int64) {
	if s.Calendar == 0 {
		_, off := arith.FloorDiv(t, s.Period)
		return t - off, t - off + s.Period
	}
	st, e := calendarWindow(time.UnixMicro(t).In(s.Location), s.Calendar)
	return st.UnixMicro(), e.UnixMicro()
}

// calendarWindow returns the calendar day, week (from Monday) or month
// that contains t, in t's location.
func calendarWindow(t time.Time, c Calendar) (start, end time.Time) {
	y, m, d := t.Date()
	switch c {
	case Week:
		d -= (int(t.Weekday()) + 6) % 7
		start = time.Date(y, m, d, 0, 0, 0, 0, t.Location())
		return start, time.Date(y, m, d+7, 0, 0, 0, 0, t.Location())
	case Month:
		start = time.Date(y, m, 1, 0, 0, 0, 0, t.Location())
		return start, time.Date(y, m+1, 1, 0, 0, 0, 0, t.Location())
	default:
		start = time.Date(y, m, d, 0, 0, 0, 0, t.Location())
		return start, time.Date(y, m, d+1, 0, 0, 0, 0, t.Location())
	}
}
