package core

import (
	"math/rand/v2"
	"testing"
	"time"
)

// TestTimeBackwardsNeverGrants drives every algorithm with random
// sequences in which the clock sometimes jumps back, and checks the one
// promise that matters: going back in time never increases what a key
// would admit.
func TestTimeBackwardsNeverGrants(t *testing.T) {
	limits := []Spec{
		must(NewBucket("token-bucket", 7, time.Second, 5, "burst")),
		must(NewBucket("gcra", 3, time.Second, 3, "max_burst+1")),
		must(NewBucket("leaky-bucket", 9, 2*time.Second, 4, "capacity")),
		must(NewWindow(Fixed, "fixed-window", 6, time.Second)),
		must(NewWindow(Log, "sliding-log", 5, time.Second)),
		must(NewWindow(Sliding, "sliding-window", 8, time.Second)),
	}
	rng := rand.New(rand.NewPCG(7, 11))
	base := time.Date(2026, 11, 22, 10, 0, 0, 0, time.UTC).UnixMicro()
	for _, l := range limits {
		for run := 0; run < 300; run++ {
			var s State
			now := base
			for i := 0; i < 60; i++ {
				now += rng.Int64N(400000)
				_, next := l.Step(&s, now, rng.Int64N(3))
				l.Commit(&s, next, now, 0, false) // the clock moves, nothing charged
				n := rng.Int64N(3)
				v, next := l.Step(&s, now, n)
				l.Commit(&s, next, now, n, v.Allowed && n > 0)
				before, _ := l.Step(&s, now, 0)
				back := now - rng.Int64N(3000000)
				after, _ := l.Step(&s, back, 0)
				if after.Remaining > before.Remaining {
					t.Fatalf("%v: at %d remaining %d; %dµs earlier remaining %d", l, now, before.Remaining, now-back, after.Remaining)
				}
			}
		}
	}
}

// TestStepIsPure checks that step never modifies the state it is given.
func TestStepIsPure(t *testing.T) {
	l := must(NewWindow(Log, "sliding-log", 10, time.Second))
	s := State{Kind: Log, C: 3, Log: []Mark{{1, 1}, {2, 2}}}
	before := append([]Mark(nil), s.Log...)
	l.Step(&s, 5_000_000, 4)
	if s.C != 3 || len(s.Log) != 2 || s.Log[0] != before[0] || s.Log[1] != before[1] {
		t.Fatalf("step modified its state: %+v", s)
	}
}

func must(s Spec, err error) Spec {
	if err != nil {
		panic(err)
	}
	return s
}

// TestTimeBackwardsNeitherGrantsNorTakes checks the clock-step promise
// (see Step) on random sequences: right after the clock steps back by any
// amount, a key reads as it did at its latest charge, and as the clock
// moves on it reads as it would have had the clock not stepped.
func TestTimeBackwardsNeitherGrantsNorTakes(t *testing.T) {
	limits := propertyLimits()
	steps := []int64{1, 999, 250000, 3000000, 3600 * 1000000, 40 * 24 * 3600 * 1000000, 20 * 365 * 24 * 3600 * 1000000}
	rng := rand.New(rand.NewPCG(3, 5))
	base := time.Date(2026, 11, 22, 10, 0, 0, 0, time.UTC).UnixMicro()
	for _, l := range limits {
		for run := 0; run < 300; run++ {
			s, _ := randomState(&l, rng, base, 20, 400000)
			// The clock time of the latest charge, and the key as it
			// reads then and a while later without a step.
			at := s.Last - s.Skew
			unstepped := s
			unstepped.Log = append([]Mark(nil), s.Log...)
			before, _ := l.Step(&s, at, 0)
			d := steps[rng.IntN(len(steps))]
			after, next := l.Step(&s, at-d, 0)
			l.Commit(&s, next, at-d, 0, false)
			if d > maxPeriodMicros {
				// Beyond the longest skew: never more than before.
				if after.Remaining > before.Remaining {
					t.Fatalf("%v: stepped back %dµs: %+v, before the step %+v", l.Kind, d, after, before)
				}
				continue
			}
			if after.Remaining != before.Remaining || after.Retry != before.Retry {
				t.Fatalf("%v: stepped back %dµs: %+v, before the step %+v", l.Kind, d, after, before)
			}
			later := rng.Int64N(3000000)
			want, _ := l.Step(&unstepped, at+later, 1)
			got, _ := l.Step(&s, at-d+later, 1)
			if got.Allowed != want.Allowed || got.Remaining != want.Remaining {
				t.Fatalf("%v: stepped back %dµs, %dµs later: %+v, without the step %+v", l.Kind, d, later, got, want)
			}
		}
	}
}

// TestChargeThenRefund checks the refund property on random sequences:
// charging n and then refunding n leaves every algorithm's State reading
// as if neither had happened, up to what time has restored meanwhile; and
// a refund never takes a key beyond its quota.
func TestChargeThenRefund(t *testing.T) {
	limits := propertyLimits()
	rng := rand.New(rand.NewPCG(9, 4))
	base := time.Date(2026, 11, 22, 10, 0, 0, 0, time.UTC).UnixMicro()
	clone := func(s State) State {
		s.Log = append([]Mark(nil), s.Log...)
		return s
	}
	for _, l := range limits {
		for run := 0; run < 500; run++ {
			s, now := randomState(&l, rng, base, 15, 300000)
			before := clone(s)
			n := 1 + rng.Int64N(4)
			_, d := l.Charge(&s, now, n)
			l.Commit(&s, d, now, min(n, l.Quota), true)
			later := now + rng.Int64N(1500000)
			v, d := l.Refund(&s, later, n)
			if !v.Allowed {
				t.Fatalf("%v: a refund was not allowed: %+v", l.Kind, v)
			}
			l.Commit(&s, d, later, -min(n, l.Quota), true)
			got, _ := l.Step(&s, later, 0)
			want, _ := l.Step(&before, later, 0)
			if got != want {
				t.Fatalf("%v: charged %d at %d, refunded at %d: %+v, without either %+v", l.Kind, n, now, later, got, want)
			}
			// A refund on a full key changes nothing.
			var full State
			v, _ = l.Refund(&full, later, n)
			if v.Remaining != l.Quota || v.Reset != 0 {
				t.Fatalf("%v: a refund on a full key: %+v", l.Kind, v)
			}
		}
	}
}

// propertyLimits are the limits the property tests run: each kind, and
// rates that do not divide their periods.
func propertyLimits() []Spec {
	return []Spec{
		must(NewBucket("token-bucket", 7, time.Second, 5, "burst")),
		must(NewBucket("gcra", 3, time.Second, 3, "max_burst+1")),
		must(NewWindow(Fixed, "fixed-window", 6, time.Second)),
		must(NewWindow(Log, "sliding-log", 5, time.Second)),
		must(NewWindow(Sliding, "sliding-window", 8, time.Second)),
	}
}

// randomState drives l through steps random requests of cost 0 to 2,
// each up to gap µs after the one before, from base, and returns the
// key's State and the time of the last request.
func randomState(l *Spec, rng *rand.Rand, base int64, steps int, gap int64) (State, int64) {
	var s State
	now := base
	for range steps {
		now += rng.Int64N(gap)
		n := rng.Int64N(3)
		v, d := l.Step(&s, now, n)
		l.Commit(&s, d, now, n, v.Allowed && n > 0)
	}
	return s, now
}
