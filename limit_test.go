package floodgate

import (
	"strings"
	"testing"
	"time"
)

func TestLimitValidation(t *testing.T) {
	tests := []struct {
		name string
		l    Limit
		ok   bool
	}{
		{"token bucket", TokenBucket(10, time.Second, 20), true},
		{"zero limit", Limit{}, false},
		{"zero rate", TokenBucket(0, time.Second, 1), false},
		{"negative rate", TokenBucket(-1, time.Second, 1), false},
		{"rate too large", TokenBucket(MaxQuota+1, time.Second, 1), false},
		{"zero burst", TokenBucket(1, time.Second, 0), false},
		{"burst at the bound", TokenBucket(MaxQuota, time.Second, MaxQuota), true},
		{"zero period", TokenBucket(1, 0, 1), false},
		{"negative period", TokenBucket(1, -time.Second, 1), false},
		{"period not whole microseconds", TokenBucket(1, 1500*time.Nanosecond, 1), false},
		{"one microsecond period", TokenBucket(1, time.Microsecond, 1), true},
		{"period too long", TokenBucket(1, MaxPeriod+time.Microsecond, 1), false},
		{"refill from empty too long", TokenBucket(1, MaxPeriod, 2), false},
		{"refill from empty beyond a Duration", TokenBucket(1, time.Hour, 1<<40), false},
		{"30 days", TokenBucket(1000, 30*24*time.Hour, 1000), true},
		{"gcra max_burst 0", GCRA(0, 1, time.Second), true},
		{"gcra negative max_burst", GCRA(-1, 1, time.Second), false},
		{"gcra zero count", GCRA(1, 0, time.Second), false},
		{"leaky zero capacity", LeakyBucket(0, 1, time.Second), false},
		{"leaky zero leak", LeakyBucket(1, 0, time.Second), false},
		{"fixed zero limit", FixedWindow(0, time.Second), false},
		{"fixed zero window", FixedWindow(1, 0), false},
		{"calendar bad unit", CalendarWindow(1, Calendar(9), nil), false},
		{"calendar nil location is UTC", CalendarWindow(1, Day, nil), true},
		{"sliding log negative", SlidingLog(-5, time.Second), false},
		{"sliding log at its maximum", SlidingLog(MaxLogQuota, 24*time.Hour), true},
		{"sliding log over its maximum", SlidingLog(MaxLogQuota+1, time.Second), false},
		{"sliding log of millions", SlidingLog(5_000_000, 24*time.Hour), false},
		{"sliding window of millions", SlidingWindow(5_000_000, 24*time.Hour), true},
		{"sliding window ok", SlidingWindow(100, time.Minute), true},
	}
	for _, tt := range tests {
		err := tt.l.Validate()
		if (err == nil) != tt.ok {
			t.Errorf("%s: Validate() = %v, want ok=%v", tt.name, err, tt.ok)
		}
		if err != nil && strings.Contains(err.Error(), "empty in -") {
			t.Errorf("%s: error %q shows a negative refill time", tt.name, err)
		}
		if err != nil && !isInvalidLimit(err) {
			t.Errorf("%s: error %v does not wrap ErrInvalidLimit", tt.name, err)
		}
	}
}

func isInvalidLimit(err error) bool {
	for e := err; e != nil; {
		if e == ErrInvalidLimit {
			return true
		}
		u, ok := e.(interface{ Unwrap() error })
		if !ok {
			return false
		}
		e = u.Unwrap()
	}
	return false
}

func TestLimitAccessors(t *testing.T) {
	g := GCRA(15, 30, time.Minute).Named("cell")
	if g.Quota() != 16 || g.Rate() != 30 || g.Period() != time.Minute || g.Name() != "cell" || g.Algorithm() != AlgorithmGCRA {
		t.Errorf("GCRA accessors: %v", g)
	}
	if got := g.String(); got != "cell: gcra 30/1m0s burst 16" {
		t.Errorf("String() = %q", got)
	}
	w := SlidingWindow(100, time.Minute)
	if w.Rate() != 100 || w.Quota() != 100 {
		t.Errorf("window Rate/Quota = %d/%d", w.Rate(), w.Quota())
	}
	for a := AlgorithmTokenBucket; a <= AlgorithmSlidingWindow; a++ {
		p, err := ParseAlgorithm(a.String())
		if err != nil || p != a {
			t.Errorf("ParseAlgorithm(%q) = %v, %v", a, p, err)
		}
	}
	if _, err := ParseAlgorithm("nope"); err == nil {
		t.Error("ParseAlgorithm(nope) succeeded")
	}
}
