package headers_test

import (
	"testing"
	"time"

	"github.com/floodgate/floodgate"
	"github.com/floodgate/floodgate/internal/lib/headers"
)

func TestPolicy(t *testing.T) {
	tests := []struct {
		limits []floodgate.Limit
		want   string
	}{
		{[]floodgate.Limit{floodgate.PerMinute(100)}, `"default";q=100;w=60`},
		{[]floodgate.Limit{floodgate.GCRA(15, 30, time.Minute)}, `"default";q=16;w=32`},
		{[]floodgate.Limit{floodgate.TokenBucket(3, time.Second, 1)}, `"default";q=1;w=1`}, // 1/3 s rounds up
		{[]floodgate.Limit{floodgate.SlidingLog(5, 1500*time.Millisecond), floodgate.CalendarWindow(1000, floodgate.Day, nil)}, `"limit-0";q=5;w=2, "limit-1";q=1000;w=86400`},
		{[]floodgate.Limit{floodgate.PerSecond(1).Named(`a "q"\é`)}, `"a \"q\"\\_";q=1;w=1`},
		{[]floodgate.Limit{floodgate.TokenBucket(1000, time.Hour, 1<<20)}, `"default";q=1048576;w=3774874`}, // 3774873.6 s
	}
	for _, tt := range tests {
		if got := headers.Policy(tt.limits); got != tt.want {
			t.Errorf("Policy(%v) = %s, want %s", tt.limits, got, tt.want)
		}
	}
}

func TestSeconds(t *testing.T) {
	tests := []struct {
		d    time.Duration
		want int64
	}{
		{0, 0}, {-time.Second, 0}, {time.Microsecond, 1}, {time.Second, 1}, {time.Second + 1, 2},
		{59*time.Second + 999*time.Millisecond, 60}, {floodgate.Never, -1},
	}
	for _, tt := range tests {
		if got := headers.Seconds(tt.d); got != tt.want {
			t.Errorf("Seconds(%s) = %d, want %d", tt.d, got, tt.want)
		}
	}
}

func TestRateLimit(t *testing.T) {
	tests := []struct {
		res   floodgate.Result
		count int
		want  string
	}{
		{floodgate.Result{Allowed: true, Remaining: 9, ResetAfter: 100 * time.Millisecond}, 1, `"default";r=9;t=1`},
		{floodgate.Result{Remaining: 0, RetryAfter: 2500 * time.Millisecond, ResetAfter: time.Hour, Index: 1, Name: "hourly"}, 2, `"hourly";r=0;t=3`},
		{floodgate.Result{Remaining: 5, RetryAfter: floodgate.Never, ResetAfter: 0, Index: 1}, 2, `"limit-1";r=5;t=0`},
	}
	for _, tt := range tests {
		if got := headers.RateLimit(tt.res, tt.count); got != tt.want {
			t.Errorf("RateLimit(%+v) = %s, want %s", tt.res, got, tt.want)
		}
	}
}
