package arith

import (
	"math/big"
	"math/rand/v2"
	"testing"
	"time"
)

func TestMulDivExact(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	check := func(a, b, c int64) {
		q, r := MulDiv(a, b, c)
		wq, wr := new(big.Int).QuoRem(new(big.Int).Mul(big.NewInt(a), big.NewInt(b)), big.NewInt(c), new(big.Int))
		if !wq.IsInt64() {
			if q != 1<<63-1 {
				t.Fatalf("MulDiv(%d,%d,%d) = %d, want saturation", a, b, c, q)
			}
			return
		}
		if q != wq.Int64() || r != wr.Int64() {
			t.Fatalf("MulDiv(%d,%d,%d) = %d,%d, want %s,%s", a, b, c, q, r, wq, wr)
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
		if q, r := FloorDiv(tc.a, tc.b); q != tc.q || r != tc.r {
			t.Errorf("FloorDiv(%d,%d) = %d,%d, want %d,%d", tc.a, tc.b, q, r, tc.q, tc.r)
		}
	}
}

func TestRoundUp(t *testing.T) {
	for _, tt := range []struct {
		d, unit time.Duration
		want    int64
	}{
		{0, time.Second, 0}, {-time.Second, time.Second, 0}, {time.Nanosecond, time.Second, 1},
		{time.Second, time.Second, 1}, {time.Second + 1, time.Second, 2}, {1500 * time.Microsecond, time.Millisecond, 2},
		{Never, time.Second, -1},
	} {
		if got := RoundUp(tt.d, tt.unit); got != tt.want {
			t.Errorf("RoundUp(%s, %s) = %d, want %d", tt.d, tt.unit, got, tt.want)
		}
	}
}
