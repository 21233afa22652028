package floodgate

import (
	"math/big"
	"math/rand/v2"
	"testing"
	"time"
)

func TestMulDivExact(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	check := func(a, b, c int64) {
		q, r := mulDiv(a, b, c)
		wq, wr := new(big.Int).QuoRem(new(big.Int).Mul(big.NewInt(a), big.NewInt(b)), big.NewInt(c), new(big.Int))
		if !wq.IsInt64() {
			if q != 1<<63-1 {
				t.Fatalf("mulDiv(%d,%d,%d) = %d, want saturation", a, b, c, q)
			}
			return
		}
		if q != wq.Int64() || r != wr.Int64() {
			t.Fatalf("mulDiv(%d,%d,%d) = %d,%d, want %s,%s", a, b, c, q, r, wq, wr)
		}
	}
	for _, tc := range [][3]int64{{0, 5, 7}, {1 << 40, 1 << 48, 1 << 40}, {1<<52 - 1, 1<<52 - 1, 1<<52 - 3}, {3, 1000000, 3}, {1 << 62, 4, 1}} {
		check(tc[0], tc[1], tc[2])
	}
	for i := 0; i < 100000; i++ {
		check(rng.Int64N(maxExact), rng.Int64N(maxExact), 1+rng.Int64N(maxExact-1))
	}
}

func TestFloorDiv(t *testing.T) {
	for _, tc := range []struct{ a, b, q, r int64 }{{7, 3, 2, 1}, {-7, 3, -3, 2}, {-6, 3, -2, 0}, {0, 5, 0, 0}} {
		if q, r := floorDiv(tc.a, tc.b); q != tc.q || r != tc.r {
			t.Errorf("floorDiv(%d,%d) = %d,%d, want %d,%d", tc.a, tc.b, q, r, tc.q, tc.r)
		}
	}
}

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
		{"sliding window ok", SlidingWindow(100, time.Minute), true},
	}
	for _, tt := range tests {
		err := tt.l.Validate()
		if (err == nil) != tt.ok {
			t.Errorf("%s: Validate() = %v, want ok=%v", tt.name, err, tt.ok)
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

// TestTimeBackwardsNeverGrants drives every algorithm with random
// sequences in which the clock sometimes jumps back, and checks the one
// promise that matters: going back in time never increases what a key
// would admit.
func TestTimeBackwardsNeverGrants(t *testing.T) {
	limits := []Limit{
		TokenBucket(7, time.Second, 5),
		GCRA(2, 3, time.Second),
		LeakyBucket(4, 9, 2*time.Second),
		FixedWindow(6, time.Second),
		SlidingLog(5, time.Second),
		SlidingWindow(8, time.Second),
	}
	rng := rand.New(rand.NewPCG(7, 11))
	base := time.Date(2026, 11, 22, 10, 0, 0, 0, time.UTC).UnixMicro()
	for _, l := range limits {
		for run := 0; run < 300; run++ {
			var s state
			now := base
			for i := 0; i < 60; i++ {
				now += rng.Int64N(400000)
				v, next := l.step(&s, now, rng.Int64N(3))
				commit(&s, next, 0, false)
				if v.allowed {
					_, next = l.step(&s, now, 0)
				}
				n := rng.Int64N(3)
				v, next = l.step(&s, now, n)
				commit(&s, next, n, v.allowed && n > 0)
				before, _ := l.step(&s, now, 0)
				back := now - rng.Int64N(3000000)
				after, _ := l.step(&s, back, 0)
				if after.remaining > before.remaining {
					t.Fatalf("%s: at %d remaining %d; %dµs earlier remaining %d", l, now, before.remaining, now-back, after.remaining)
				}
			}
		}
	}
}

// TestStepIsPure checks that step never modifies the state it is given.
func TestStepIsPure(t *testing.T) {
	l := SlidingLog(10, time.Second)
	s := state{kind: kindLog, c: 3, log: []mark{{1, 1}, {2, 2}}}
	before := append([]mark(nil), s.log...)
	l.step(&s, 5_000_000, 4)
	if s.c != 3 || len(s.log) != 2 || s.log[0] != before[0] || s.log[1] != before[1] {
		t.Fatalf("step modified its state: %+v", s)
	}
}
