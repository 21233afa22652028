package storetest

import (
	"time"
	_ "time/tzdata" // calendar windows in named zones, on machines without tzdata

	fg "github.com/floodgate/floodgate"
)

// Scenarios returns the suite's fixed-clock scenarios. Every expected value
// was worked out by hand from the algorithm's definition (see the comments
// in algo.go), not recorded from a run.
func Scenarios() []Scenario {
	newYork, err := time.LoadLocation("America/New_York")
	if err != nil {
		panic(err) // time/tzdata is linked in: cannot happen
	}
	cet := time.FixedZone("UTC+1", 3600)
	nov1 := time.Date(2026, 11, 1, 5, 0, 0, 0, time.UTC).Sub(Base) // 01:00 EDT on the 25-hour day

	return []Scenario{
		{
			// T = 100ms, τ = 500ms.
			Name:   "token-bucket/burst-then-refill",
			Limits: []fg.Limit{fg.TokenBucket(10, sec, 5)},
			Steps: []Step{
				{At: 0, N: 1, Want: ok(5, 4, 100*ms)},
				{At: 0, N: 1, Want: ok(5, 3, 200*ms)},
				{At: 0, N: 1, Want: ok(5, 2, 300*ms)},
				{At: 0, N: 1, Want: ok(5, 1, 400*ms)},
				{At: 0, N: 1, Want: ok(5, 0, 500*ms)},
				{At: 0, N: 1, Want: no(5, 0, 100*ms, 500*ms)},
				{At: 100 * ms, N: 1, Want: ok(5, 0, 500*ms)},
				{At: 250 * ms, N: 1, Want: ok(5, 0, 450*ms)},
				{At: 250 * ms, N: 0, Want: ok(5, 0, 450*ms)},
				{At: 1250 * ms, N: 0, Want: ok(5, 5, 0)},
				{At: 1250 * ms, N: 3, Want: ok(5, 2, 300*ms)},
			},
		},
		{
			// T = 333333.33…µs: exact, so the second request is 1µs early.
			Name:   "token-bucket/partial-refill-exact-thirds",
			Limits: []fg.Limit{fg.TokenBucket(3, sec, 3)},
			Steps: []Step{
				{At: 0, N: 3, Want: ok(3, 0, sec)},
				{At: 333333 * us, N: 1, Want: no(3, 0, 1*us, 666667*us)},
				{At: 333334 * us, N: 1, Want: ok(3, 0, 1000000*us)},
				{At: sec, N: 0, Want: ok(3, 2, 333334*us)},
			},
		},
		{
			// T = 3.33…µs: one in 3.33µs, not one in 3µs.
			Name:   "token-bucket/300k-per-second",
			Limits: []fg.Limit{fg.TokenBucket(300000, sec, 300000)},
			Steps: []Step{
				{At: 0, N: 300000, Want: ok(300000, 0, sec)},
				{At: 9 * us, N: 3, Want: no(300000, 2, 1*us, sec-9*us)},
				{At: 10 * us, N: 3, Want: ok(300000, 0, sec)},
			},
		},
		{
			Name:   "token-bucket/a-million-per-second",
			Limits: []fg.Limit{fg.TokenBucket(1000000, sec, 1000000)},
			Steps: []Step{
				{At: 0, N: 1000000, Want: ok(1000000, 0, sec)},
				{At: 1 * us, N: 1, Want: ok(1000000, 0, sec)},
				{At: 1 * us, N: 1, Want: no(1000000, 0, 1*us, sec)},
			},
		},
		{
			Name:   "token-bucket/cost-larger-than-burst",
			Limits: []fg.Limit{fg.TokenBucket(10, sec, 5)},
			Steps: []Step{
				{At: 0, N: 6, Want: no(5, 5, fg.Never, 0)},
				{At: 0, N: 1 << 62, Want: no(5, 5, fg.Never, 0)},
				{At: 0, N: 1, Want: ok(5, 4, 100*ms)},
				{At: 0, N: 6, Want: no(5, 4, fg.Never, 100*ms)},
				{At: 0, N: 5, Want: no(5, 4, 100*ms, 100*ms)},
			},
		},
		{
			// The clock jumps back 5s: TAT stays at 11s, nothing is granted.
			Name:   "token-bucket/time-goes-backwards",
			Limits: []fg.Limit{fg.TokenBucket(1, sec, 1)},
			Steps: []Step{
				// The clock steps back 5s: the key is read as of its
				// latest charge, neither refilled nor drained, and refills
				// as the clock moves on.
				{At: 10 * sec, N: 1, Want: ok(1, 0, sec)},
				{At: 5 * sec, N: 1, Want: no(1, 0, sec, sec)},
				{At: 5 * sec, N: 0, Want: ok(1, 0, sec)},
				{At: 5*sec + 500*ms, N: 1, Want: no(1, 0, 500*ms, 500*ms)},
				{At: 6 * sec, N: 1, Want: ok(1, 0, sec)},
				{At: 6*sec + 500*ms, N: 1, Want: no(1, 0, 500*ms, 500*ms)},
				{At: 7 * sec, N: 1, Want: ok(1, 0, sec)},
			},
		},
		{
			// x/time/rate's TestLimiterJumpBackwards (rate_test.go): 10 per
			// second, burst 3; the clock jumps back from t1 to t0 with two
			// tokens left, which are still there, and one more comes at t1
			// and t2.
			Name:   "token-bucket/x-time-rate-jump-backwards",
			Limits: []fg.Limit{fg.TokenBucket(10, sec, 3)},
			Steps: []Step{
				{At: 100 * ms, N: 1, Want: ok(3, 2, 100*ms)},
				{At: 0, N: 1, Want: ok(3, 1, 200*ms)},
				{At: 0, N: 1, Want: ok(3, 0, 300*ms)},
				{At: 0, N: 1, Want: no(3, 0, 100*ms, 300*ms)},
				{At: 0, N: 1, Want: no(3, 0, 100*ms, 300*ms)},
				{At: 100 * ms, N: 1, Want: ok(3, 0, 300*ms)},
				{At: 100 * ms, N: 1, Want: no(3, 0, 100*ms, 300*ms)},
				{At: 100 * ms, N: 1, Want: no(3, 0, 100*ms, 300*ms)},
				{At: 200 * ms, N: 1, Want: ok(3, 0, 300*ms)},
				{At: 200 * ms, N: 1, Want: no(3, 0, 100*ms, 300*ms)},
				{At: 200 * ms, N: 1, Want: no(3, 0, 100*ms, 300*ms)},
			},
		},
		{
			// x/time/rate's TestReserveJumpBack: 10 per second, burst 2;
			// after a jump back from t1 to t0 the next token is due at t1.
			// (x/time/rate reserves it; floodgate says when to retry.)
			Name:   "token-bucket/x-time-rate-reserve-jump-back",
			Limits: []fg.Limit{fg.TokenBucket(10, sec, 2)},
			Steps: []Step{
				{At: 100 * ms, N: 2, Want: ok(2, 0, 200*ms)},
				{At: 0, N: 1, Want: no(2, 0, 100*ms, 200*ms)},
				{At: 100 * ms, N: 1, Want: ok(2, 0, 200*ms)},
				{At: 200 * ms, N: 1, Want: ok(2, 0, 200*ms)},
			},
		},
		{
			// A step back of an hour: what was left is still there, and
			// the key refills as the clock moves on.
			Name:   "token-bucket/clock-back-an-hour",
			Limits: []fg.Limit{fg.TokenBucket(10, sec, 5)},
			Steps: []Step{
				{At: hr, N: 3, Want: ok(5, 2, 300*ms)},
				{At: 0, N: 2, Want: ok(5, 0, 500*ms)},
				{At: 0, N: 1, Want: no(5, 0, 100*ms, 500*ms)},
				{At: 100 * ms, N: 1, Want: ok(5, 0, 500*ms)},
				{At: 600 * ms, N: 0, Want: ok(5, 5, 0)},
			},
		},
		{
			Name:   "fixed-window/clock-back-an-hour",
			Limits: []fg.Limit{fg.FixedWindow(5, minute)},
			Steps: []Step{
				{At: hr + 30*sec, N: 3, Want: ok(5, 2, 30*sec)},
				{At: 30 * sec, N: 2, Want: ok(5, 0, 30*sec)},
				{At: 30 * sec, N: 1, Want: no(5, 0, 30*sec, 30*sec)},
				{At: 60 * sec, N: 1, Want: ok(5, 4, 60*sec)},
			},
		},
		{
			// Before the step: window [1h, 1h+1m) holds 3. After it the
			// window goes on, 1h ahead of the clock.
			Name:   "sliding-window/clock-back-an-hour",
			Limits: []fg.Limit{fg.SlidingWindow(5, minute)},
			Steps: []Step{
				{At: hr + 30*sec, N: 3, Want: ok(5, 2, 90*sec)},
				{At: 30 * sec, N: 2, Want: ok(5, 0, 90*sec)},
				{At: 30 * sec, N: 1, Want: no(5, 0, 42*sec, 90*sec)},
				{At: 72 * sec, N: 1, Want: ok(5, 0, 108*sec)},
			},
		},
		{
			Name:   "sliding-log/clock-back-an-hour",
			Limits: []fg.Limit{fg.SlidingLog(5, minute)},
			Steps: []Step{
				{At: hr + 30*sec, N: 3, Want: ok(5, 2, 60*sec)},
				{At: 30 * sec, N: 2, Want: ok(5, 0, 60*sec)},
				{At: 30 * sec, N: 1, Want: no(5, 0, 60*sec, 60*sec)},
				{At: 90 * sec, N: 1, Want: ok(5, 4, 60*sec)},
			},
		},
		{
			// A charge is taken whatever the limit says, into debt; later
			// requests wait until the debt is repaid. One charge takes at
			// most the burst.
			Name:   "token-bucket/charge-into-debt",
			Limits: []fg.Limit{fg.TokenBucket(10, sec, 5)},
			Steps: []Step{
				{At: 0, N: 4, Want: ok(5, 1, 400*ms)},
				{At: 0, Op: Charge, N: 3, Want: ok(5, 0, 700*ms)},
				{At: 0, N: 1, Want: no(5, 0, 300*ms, 700*ms)},
				{At: 300 * ms, N: 1, Want: ok(5, 0, 500*ms)},
				{At: 300 * ms, Op: Charge, N: 100, Want: ok(5, 0, sec)},
				{At: 900 * ms, N: 1, Want: ok(5, 0, 500*ms)},
				{At: 900 * ms, N: 1, Want: no(5, 0, 100*ms, 500*ms)},
			},
		},
		{
			Name:   "fixed-window/charge-into-debt",
			Limits: []fg.Limit{fg.FixedWindow(5, minute)},
			Steps: []Step{
				{At: 0, N: 4, Want: ok(5, 1, minute)},
				{At: 10 * sec, Op: Charge, N: 3, Want: ok(5, 0, 50*sec)},
				{At: 20 * sec, N: 1, Want: no(5, 0, 40*sec, 40*sec)},
				{At: minute, N: 1, Want: ok(5, 4, minute)},
			},
		},
		{
			Name:   "sliding-log/charge-into-debt",
			Limits: []fg.Limit{fg.SlidingLog(3, minute)},
			Steps: []Step{
				{At: 0, N: 2, Want: ok(3, 1, minute)},
				{At: 10 * sec, Op: Charge, N: 2, Want: ok(3, 0, minute)},
				{At: 20 * sec, N: 1, Want: no(3, 0, 40*sec, 50*sec)},
				{At: 61 * sec, N: 1, Want: ok(3, 0, minute)},
			},
		},
		{
			// A log is charged at most to twice its limit, so that charges
			// cannot grow it, and the work of expiring it, without bound:
			// the third charge records nothing, and the log is clear once
			// the first two have expired.
			Name:   "sliding-log/charge-stops-at-twice-the-limit",
			Limits: []fg.Limit{fg.SlidingLog(3, minute)},
			Steps: []Step{
				{At: 0, Op: Charge, N: 3, Want: ok(3, 0, minute)},
				{At: 10 * sec, Op: Charge, N: 3, Want: ok(3, 0, minute)},
				{At: 20 * sec, Op: Charge, N: 3, Want: ok(3, 0, 50*sec)},
				{At: 30 * sec, N: 1, Want: no(3, 0, 40*sec, 40*sec)},
				{At: 70 * sec, N: 1, Want: ok(3, 2, minute)},
			},
		},
		{
			// A charge that finds the log full records nothing, but the
			// clock's step back that it saw is kept, as for any request
			// not charged: the key rejoins the clock at 60s, when its
			// marks have expired on its own time line.
			Name:   "sliding-log/full-charge-keeps-a-clock-step",
			Limits: []fg.Limit{fg.SlidingLog(2, minute)},
			Steps: []Step{
				{At: 10 * sec, Op: Charge, N: 2, Want: ok(2, 0, minute)},
				{At: 10 * sec, Op: Charge, N: 2, Want: ok(2, 0, minute)},
				{At: 0, Op: Charge, N: 2, Want: ok(2, 0, minute)},
				{At: 65 * sec, N: 1, Want: ok(2, 1, minute)},
			},
		},
		{
			// A refund gives back exactly what was charged, never beyond
			// the burst; a full key stays full.
			Name:   "token-bucket/refund",
			Limits: []fg.Limit{fg.TokenBucket(10, sec, 5)},
			Steps: []Step{
				{At: 0, Op: Refund, N: 3, Want: ok(5, 5, 0)},
				{At: 0, N: 5, Want: ok(5, 0, 500*ms)},
				{At: 0, Op: Refund, N: 2, Want: ok(5, 2, 300*ms)},
				{At: 100 * ms, Op: Refund, N: 9, Want: ok(5, 5, 0)},
				{At: 100 * ms, N: 5, Want: ok(5, 0, 500*ms)},
			},
		},
		{
			Name:   "fixed-window/refund",
			Limits: []fg.Limit{fg.FixedWindow(5, minute)},
			Steps: []Step{
				{At: 0, N: 5, Want: ok(5, 0, minute)},
				{At: 10 * sec, Op: Refund, N: 2, Want: ok(5, 2, 50*sec)},
				{At: 20 * sec, N: 2, Want: ok(5, 0, 40*sec)},
				{At: 30 * sec, Op: Refund, N: 9, Want: ok(5, 5, 0)},
				{At: minute, Op: Refund, N: 1, Want: ok(5, 5, 0)},
			},
		},
		{
			// From the current window first, then from the previous one.
			Name:   "sliding-window/refund",
			Limits: []fg.Limit{fg.SlidingWindow(4, minute)},
			Steps: []Step{
				{At: 0, N: 4, Want: ok(4, 0, 2*minute)},
				{At: 30 * sec, Op: Refund, N: 1, Want: ok(4, 1, 90*sec)},
				{At: 90 * sec, Op: Refund, N: 1, Want: ok(4, 3, 30*sec)},
			},
		},
		{
			// The newest units go first.
			Name:   "sliding-log/refund",
			Limits: []fg.Limit{fg.SlidingLog(3, minute)},
			Steps: []Step{
				{At: 0, N: 1, Want: ok(3, 2, minute)},
				{At: 10 * sec, N: 2, Want: ok(3, 0, minute)},
				{At: 20 * sec, Op: Refund, N: 1, Want: ok(3, 1, 50*sec)},
				{At: 30 * sec, Op: Refund, N: 5, Want: ok(3, 3, 0)},
				{At: 30 * sec, N: 3, Want: ok(3, 0, minute)},
			},
		},
		{
			// A refund on a key whose clock stepped back again keeps the
			// key's skew: its time line stands at its latest charge, as
			// before the refund, until a charge records the longer step.
			Name:   "sliding-log/refund-after-a-second-step-back",
			Limits: []fg.Limit{fg.SlidingLog(5, minute)},
			Steps: []Step{
				{At: 2 * hr, N: 2, Want: ok(5, 3, minute)},
				{At: hr, N: 1, Want: ok(5, 2, minute)},
				{At: 0, Op: Refund, N: 1, Want: ok(5, 3, minute)},
				{At: 30 * sec, N: 4, Want: no(5, 3, minute, minute)},
			},
		},
		{
			// Ten units or more at one instant, a refund of one, and a
			// charge at that instant again: every unit counts once (a
			// store that names each unit must not reuse a name the
			// refund left taken), so the limit admits 20 and no more.
			Name:   "sliding-log/refund-then-charge-at-one-instant",
			Limits: []fg.Limit{fg.SlidingLog(20, minute)},
			Steps: []Step{
				{At: 0, N: 10, Want: ok(20, 10, minute)},
				{At: 0, Op: Refund, N: 1, Want: ok(20, 11, minute)},
				{At: 0, N: 1, Want: ok(20, 10, minute)},
				{At: 0, N: 10, Want: ok(20, 0, minute)},
				{At: 0, N: 1, Want: no(20, 0, minute, minute)},
			},
		},
		{
			// Settle corrects an estimate to the real cost: a refund of
			// the difference, or a charge of it into debt, in quota-sized
			// charges; the same cost settles nothing.
			Name:   "token-bucket/settle",
			Limits: []fg.Limit{fg.TokenBucket(10, sec, 5)},
			Steps: []Step{
				{At: 0, N: 5, Want: ok(5, 0, 500*ms)},
				{At: 0, Op: Settle, N: 5, Cost: 2, Want: ok(5, 3, 200*ms)},
				{At: 0, Op: Settle, N: 1, Cost: 20, Want: ok(5, 0, 2100*ms)},
				{At: 1600 * ms, N: 1, Want: no(5, 0, 100*ms, 500*ms)},
				{At: 1700 * ms, N: 1, Want: ok(5, 0, 500*ms)},
				{At: 1700 * ms, Op: Settle, N: 1, Cost: 1, Want: ok(5, 0, 500*ms)},
			},
		},
		{
			Name:   "fixed-window/settle",
			Limits: []fg.Limit{fg.FixedWindow(5, minute)},
			Steps: []Step{
				{At: 0, N: 4, Want: ok(5, 1, minute)},
				{At: 10 * sec, Op: Settle, N: 4, Cost: 1, Want: ok(5, 4, 50*sec)},
				{At: 20 * sec, Op: Settle, N: 1, Cost: 12, Want: ok(5, 0, 40*sec)},
				{At: 30 * sec, N: 1, Want: no(5, 0, 30*sec, 30*sec)},
				{At: minute, N: 1, Want: ok(5, 4, minute)},
			},
		},
		{
			Name:   "sliding-log/settle",
			Limits: []fg.Limit{fg.SlidingLog(3, minute)},
			Steps: []Step{
				{At: 0, N: 3, Want: ok(3, 0, minute)},
				{At: 10 * sec, Op: Settle, N: 3, Cost: 1, Want: ok(3, 2, 50*sec)},
				{At: 20 * sec, N: 2, Want: ok(3, 0, minute)},
			},
		},
		{
			// T = 30 days / 1000 = 43m12s.
			Name:   "token-bucket/30-day-period",
			Limits: []fg.Limit{fg.TokenBucket(1000, 30*day, 1000)},
			Steps: []Step{
				{At: 0, N: 1000, Want: ok(1000, 0, 30*day)},
				{At: 43*minute + 12*sec - 1*us, N: 1, Want: no(1000, 0, 1*us, 30*day-43*minute-12*sec+1*us)},
				{At: 43*minute + 12*sec, N: 1, Want: ok(1000, 0, 30*day)},
			},
		},
		{
			Name:   "token-bucket/500ms-period",
			Limits: []fg.Limit{fg.TokenBucket(1, 500*ms, 1)},
			Steps: []Step{
				{At: 0, N: 1, Want: ok(1, 0, 500*ms)},
				{At: 0, N: 1, Want: no(1, 0, 500*ms, 500*ms)},
				{At: 499999 * us, N: 1, Want: no(1, 0, 1*us, 1*us)},
				{At: 500 * ms, N: 1, Want: ok(1, 0, 500*ms)},
			},
		},
		{
			Name:   "token-bucket/one-per-hour",
			Limits: []fg.Limit{fg.TokenBucket(1, hr, 2)},
			Steps: []Step{
				{At: 0, N: 1, Want: ok(2, 1, hr)},
				{At: 0, N: 1, Want: ok(2, 0, 2*hr)},
				{At: 0, N: 1, Want: no(2, 0, hr, 2*hr)},
				{At: hr, N: 1, Want: ok(2, 0, 2*hr)},
			},
		},
		{
			// CL.THROTTLE user123 15 30 60: T = 2s, τ = 32s, limit 16.
			Name:   "gcra/redis-cell-readme-then-drain",
			Limits: []fg.Limit{fg.GCRA(15, 30, time.Minute)},
			Steps: []Step{
				{At: 0, N: 1, Want: ok(16, 15, 2*sec)},
				{At: 0, N: 15, Want: ok(16, 0, 32*sec)},
				{At: 0, N: 1, Want: no(16, 0, 2*sec, 32*sec)},
				{At: 0, N: 17, Want: no(16, 0, fg.Never, 32*sec)},
				{At: 2 * sec, N: 1, Want: ok(16, 0, 32*sec)},
			},
		},
		{
			Name:   "leaky-bucket/funnel",
			Limits: []fg.Limit{fg.LeakyBucket(5, 1, sec)},
			Steps: []Step{
				{At: 0, N: 5, Want: ok(5, 0, 5*sec)},
				{At: 0, N: 1, Want: no(5, 0, sec, 5*sec)},
				{At: sec, N: 1, Want: ok(5, 0, 5*sec)},
				{At: 3 * sec, N: 0, Want: ok(5, 2, 3*sec)},
			},
		},
		{
			Name:   "fixed-window/minute",
			Limits: []fg.Limit{fg.FixedWindow(3, time.Minute)},
			Steps: []Step{
				{At: 10 * sec, N: 1, Repeat: 3, Want: ok(3, 2, 50*sec)},
				{At: 20 * sec, N: 1, Want: no(3, 0, 40*sec, 40*sec)},
				{At: 20 * sec, N: 4, Want: no(3, 0, fg.Never, 40*sec)},
				{At: 60 * sec, N: 1, Want: ok(3, 2, 60*sec)},
				// Back in time: counted in the same window, which still
				// ends 60s after its first charge.
				{At: 59 * sec, N: 1, Want: ok(3, 1, 60*sec)},
				{At: 118 * sec, N: 1, Want: ok(3, 0, sec)},
				// The key's next window runs 1s ahead of the clock's.
				{At: 119 * sec, N: 1, Want: ok(3, 2, 60*sec)},
				{At: 2 * minute, N: 0, Want: ok(3, 2, 59*sec)},
				{At: 3 * minute, N: 0, Want: ok(3, 3, 0)},
			},
		},
		{
			Name:   "fixed-window/500ms",
			Limits: []fg.Limit{fg.FixedWindow(2, 500*ms)},
			Steps: []Step{
				{At: 0, N: 2, Want: ok(2, 0, 500*ms)},
				{At: 499999 * us, N: 1, Want: no(2, 0, 1*us, 1*us)},
				{At: 500 * ms, N: 1, Want: ok(2, 1, 500*ms)},
			},
		},
		{
			// 10:00Z is 11:00 at UTC+1: the day ends in 13h.
			Name:   "calendar-window/day-utc+1",
			Limits: []fg.Limit{fg.CalendarWindow(2, fg.Day, cet)},
			Steps: []Step{
				{At: 0, N: 2, Want: ok(2, 0, 13*hr)},
				{At: 0, N: 1, Want: no(2, 0, 13*hr, 13*hr)},
				{At: 13 * hr, N: 1, Want: ok(2, 1, 24*hr)},
			},
		},
		{
			// Sunday 22 November 2026: the week ends at Monday 00:00.
			Name:   "calendar-window/week-and-month",
			Limits: []fg.Limit{fg.CalendarWindow(1, fg.Week, nil), fg.CalendarWindow(5, fg.Month, time.UTC)},
			Steps: []Step{
				{At: 0, N: 1, Want: at(ok(1, 0, 14*hr), 0)},
				{At: 0, N: 1, Want: at(no(1, 0, 14*hr, 14*hr), 0)},
				{At: 14 * hr, N: 4, Want: at(no(1, 1, fg.Never, 0), 0)},
				{At: 14 * hr, N: 1, Want: at(ok(1, 0, 7*day), 0)},
				{At: 14 * hr, N: 0, Want: at(ok(1, 0, 7*day), 0)},
			},
		},
		{
			// New York, 1 November 2026: a 25-hour day (DST ends).
			Name:   "calendar-window/day-of-25-hours",
			Limits: []fg.Limit{fg.CalendarWindow(1, fg.Day, newYork)},
			Steps: []Step{
				{At: nov1, N: 1, Want: ok(1, 0, 24*hr)},
				{At: nov1 + 23*hr, N: 1, Want: no(1, 0, hr, hr)},
				{At: nov1 + 24*hr, N: 1, Want: ok(1, 0, 24*hr)},
			},
		},
		{
			Name:   "sliding-log/minute",
			Limits: []fg.Limit{fg.SlidingLog(3, time.Minute)},
			Steps: []Step{
				{At: 0, N: 1, Want: ok(3, 2, 60*sec)},
				{At: 10 * sec, N: 1, Want: ok(3, 1, 60*sec)},
				{At: 20 * sec, N: 1, Want: ok(3, 0, 60*sec)},
				{At: 30 * sec, N: 1, Want: no(3, 0, 30*sec, 50*sec)},
				{At: 30 * sec, N: 4, Want: no(3, 0, fg.Never, 50*sec)},
				{At: 60 * sec, N: 1, Want: ok(3, 0, 60*sec)},
				{At: 65 * sec, N: 2, Want: no(3, 0, 15*sec, 55*sec)},
				// Back in time: the log is read as of its newest mark.
				{At: 40 * sec, N: 1, Want: no(3, 0, 10*sec, 60*sec)},
				{At: 50 * sec, N: 1, Want: ok(3, 0, 60*sec)},
				{At: 130 * sec, N: 0, Want: ok(3, 3, 0)},
			},
		},
		{
			Name:   "sliding-log/costs",
			Limits: []fg.Limit{fg.SlidingLog(5, sec)},
			Steps: []Step{
				{At: 0, N: 2, Want: ok(5, 3, sec)},
				{At: 300 * ms, N: 3, Want: ok(5, 0, sec)},
				{At: 600 * ms, N: 1, Want: no(5, 0, 400*ms, 700*ms)},
				{At: sec, N: 2, Want: ok(5, 0, sec)},
				{At: 1200 * ms, N: 1, Want: no(5, 0, 100*ms, 800*ms)},
			},
		},
		{
			// The Cloudflare example: 42 in the previous minute, 18 in the
			// first 15s of this one: ceil(42*45/60) + 18 = 32 + 18 = 50.
			Name:   "sliding-window/cloudflare",
			Limits: []fg.Limit{fg.SlidingWindow(50, time.Minute)},
			Steps: []Step{
				{At: 30 * sec, N: 42, Want: ok(50, 8, 90*sec)},
				{At: 75 * sec, N: 18, Want: ok(50, 0, 105*sec)},
				// ceil(42*(60-e)/60) <= 31 from e = 60 - floor(31*60/42) s.
				{At: 75 * sec, N: 1, Want: no(50, 0, 714286*us, 105*sec)},
				{At: 75 * sec, N: 51, Want: no(50, 0, fg.Never, 105*sec)},
				{At: 75714286 * us, N: 1, Want: ok(50, 0, 104285714*us)},
				// 14 + 19 + 40 > 50 until the next window, where
				// ceil(19*(60-e)/60) <= 10 from e = 60 - floor(10*60/19) s.
				{At: 100 * sec, N: 40, Want: no(50, 17, 48421053*us, 80*sec)},
				{At: 148421052 * us, N: 40, Want: no(50, 39, 1*us, 31578948*us)},
				{At: 148421053 * us, N: 40, Want: ok(50, 0, 91578947*us)},
			},
		},
		{
			Name:   "sliding-window/peek-fresh-key",
			Limits: []fg.Limit{fg.SlidingWindow(10, sec)},
			Steps: []Step{
				{At: 0, N: 0, Want: ok(10, 10, 0)},
				{At: 0, N: 11, Want: no(10, 10, fg.Never, 0)},
			},
		},
		{
			// 1 per second with burst 2, and 3 per hour.
			Name:   "multi-limit/second-and-hour",
			Limits: []fg.Limit{fg.TokenBucket(1, sec, 2), fg.FixedWindow(3, hr)},
			Steps: []Step{
				{At: 0, N: 1, Want: at(ok(2, 1, sec), 0)},
				{At: 0, N: 1, Want: at(ok(2, 0, 2*sec), 0)},
				{At: 0, N: 1, Want: at(no(2, 0, sec, 2*sec), 0)},
				{At: sec, N: 1, Want: at(ok(2, 0, 2*sec), 0)},
				// The hour denies; the second's bucket is not charged.
				{At: 3 * sec, N: 1, Want: at(no(3, 0, hr-3*sec, hr-3*sec), 1)},
				{At: 3 * sec, N: 0, Want: at(ok(3, 0, hr-3*sec), 1)},
				{At: 3 * sec, N: 5, Want: at(no(2, 2, fg.Never, 0), 0)},
				{At: hr, N: 2, Want: at(ok(2, 0, 2*sec), 0)},
			},
		},
		{
			Name:   "multi-limit/log-and-counter",
			Limits: []fg.Limit{fg.SlidingLog(1, time.Minute), fg.SlidingWindow(2, time.Minute)},
			Steps: []Step{
				{At: 0, N: 1, Want: at(ok(1, 0, 60*sec), 0)},
				{At: 0, N: 1, Want: at(no(1, 0, 60*sec, 60*sec), 0)},
				{At: 60 * sec, N: 1, Want: at(ok(1, 0, 60*sec), 0)},
				{At: 60 * sec, N: 0, Want: at(ok(1, 0, 60*sec), 0)},
			},
		},
		{
			Name:   "reset",
			Limits: []fg.Limit{fg.TokenBucket(1, time.Minute, 1), fg.SlidingLog(2, time.Minute)},
			Steps: []Step{
				{At: 0, N: 1, Want: at(ok(1, 0, time.Minute), 0)},
				{At: 0, N: 1, Want: at(no(1, 0, time.Minute, time.Minute), 0)},
				{At: 0, Op: Reset},
				{At: 0, N: 0, Want: at(ok(1, 1, 0), 0)},
				{At: 0, N: 1, Want: at(ok(1, 0, time.Minute), 0)},
				{At: 0, Op: Reset, Key: "never-seen"},
			},
		},
		{
			Name:   "key-isolation",
			Limits: []fg.Limit{fg.GCRA(0, 1, time.Minute)},
			Steps: []Step{
				{At: 0, Key: "a", N: 1, Want: ok(1, 0, time.Minute)},
				{At: 0, Key: "b", N: 1, Want: ok(1, 0, time.Minute)},
				{At: 0, Key: "a", N: 1, Want: no(1, 0, time.Minute, time.Minute)},
				{At: 0, Key: "b\x00", N: 1, Want: ok(1, 0, time.Minute)},
				{At: 0, Key: "{a}", N: 1, Want: ok(1, 0, time.Minute)},
			},
		},
		{
			// golang.org/x/time/rate's TestSimpleReserve, as Wait: 10/s,
			// burst 2; the second wait of 2 at 0 acts at 200ms, the third
			// (asked at 300ms) at 400ms.
			Name:   "wait/x-time-rate-simple-reserve",
			Limits: []fg.Limit{fg.TokenBucket(10, sec, 2)},
			Steps: []Step{
				{At: 0, Op: Wait, N: 2, Want: fg.Result{Allowed: true}},
				{At: 0, Op: Wait, N: 2, Want: fg.Result{Allowed: true, RetryAfter: 200 * ms}},
				{At: 300 * ms, Op: Wait, N: 2, Want: fg.Result{Allowed: true, RetryAfter: 100 * ms}},
			},
		},
	}
}
