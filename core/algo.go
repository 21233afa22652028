package core

import "github.com/floodgate/floodgate/internal/lib/arith"

// This file holds the algorithms as pure functions of (state, limit, now,
// cost): no I/O, no clock, no allocation. Each is mirrored by a Lua
// function of the same name in the Redis store (redisstore/prelude.lua and
// decide.lua), and the conformance and differential tests demand that
// both give identical results.
//
// Step returns the Verdict and the change to store if the request is
// charged; it never modifies the State it is given, so a store can check
// several limits and charge them only if all allow. Commit then applies
// the change.

// State is one limit's stored state on one key. The zero State (of any
// kind) means "full": nothing has been admitted recently. A store keeps one
// State per limit per key and passes it to Step and Commit; a State whose
// Kind differs from the limit's is stale (the key was used with other
// limits) and should be zeroed first.
//
//	Bucket:  A = TAT (theoretical arrival time) in µs, B = its fraction
//	         in 1/C µs, C = the rate the fraction is counted in
//	Fixed:   A = window start in µs, B = count admitted in it
//	Sliding: A = current window start in µs, B = previous window's
//	         count, C = current window's count
//	Log:     Log = admitted units, oldest first; C = their total
//
// Last and Skew keep time from going backwards for the key (see Step):
// Last is the time (µs, on the key's own time line) of the latest charge,
// and Skew is how far that time line runs ahead of the clock, the sum of
// the backward clock steps the key has seen while it was in use. Both are
// 0 on a key that never saw the clock go back.
type State struct {
	Kind       Kind
	A, B, C    int64
	Last, Skew int64
	// Log comes last: the other fields are what a bucket or a window
	// reads and writes, 48 bytes that share one cache line with the
	// memory store's lock.
	Log []Mark
}

// Delta is what Step computes for Commit to apply: the State's A, B and
// C, and T, the time the State was read at on the key's time line (see
// Step), which with now gives Commit the State's Last and Skew. For Log
// it is not a state but the change to make: A = marks to drop from the
// front, B = the time to record, C = the total left after dropping.
//
// Four fields are the most that Go's compiler keeps in registers; a fifth
// would make every decision copy its Delta through memory, which costs
// the hot path about a quarter of its time.
type Delta struct {
	A, B, C int64
	T       int64
}

// Verdict is one limit's decision on one request, in microseconds.
type Verdict struct {
	// Allowed reports whether the request fits this limit.
	Allowed bool
	// Remaining is how many units the limit would admit right now, after
	// this request if it is charged; counts round down.
	Remaining int64
	// Retry is how long until the same request could pass: 0 when allowed,
	// NeverMicros when its cost is larger than the quota; durations round up.
	Retry int64
	// Reset is how long until the limit is full again if nothing else
	// comes.
	Reset int64
}

// Mark is one entry of a sliding log: N units admitted at time At (µs).
type Mark struct{ At, N int64 }

// Step decides a request of cost n >= 0 at time now (µs) against l, given
// the key's State s for l. A cost of 0 is a peek: always allowed, never
// charged.
//
// When the clock goes backwards (now is before the key's latest charge),
// Step neither grants nor takes capacity, as x/time/rate does: it reads
// the State as of its latest charge and lets time run on from there. The
// key keeps the size of the step as its Skew and decides on now + Skew
// from then on, until it has nothing left to remember (a bucket full
// again, a window over by the clock too; see Hold), when its own time line
// rejoins the clock. A key that was within its limit before a step back of an
// hour is still within it after, and refills at its rate as the clock
// moves on. Verdicts are durations, the same on either time line. Only
// charges move a key's latest time, as only they do in x/time/rate.
func (l *Spec) Step(s *State, now, n int64) (Verdict, Delta) {
	if s.Skew != 0 || now < s.Last {
		return l.stepBehind(s, now, n, take)
	}
	// step's dispatch, spelled out: one call fewer on the hot path.
	var v Verdict
	var next Delta
	switch l.Kind {
	case Bucket:
		v, next = l.stepBucket(s, now, n, take)
	case Fixed:
		v, next = l.stepFixed(s, now, n, take)
	case Sliding:
		v, next = l.stepSliding(s, now, n, take)
	case Log:
		v, next = l.stepLog(s, now, n, take)
	}
	if n == 0 {
		v.Allowed, v.Retry = true, 0
	}
	next.T = now
	return v, next
}

// Charge is Step for a cost that is charged whatever the limit says: a
// cost that was admitted elsewhere (by a fallback's local limiter while
// Redis was away) or is known only after the fact. It may take the key
// into debt, so that later requests wait until the debt is repaid. One
// Charge takes at most the limit's Quota (a larger n charges the Quota),
// and a key's debt stays within MaxPeriod of refill, which keeps the
// arithmetic exact; a sliding log's count stays within twice its Quota
// (a charge beyond that records only what fits), which bounds the marks
// one key keeps and one request expires. Commit the result with charged
// = true.
func (l *Spec) Charge(s *State, now, n int64) (Verdict, Delta) {
	n = min(n, l.Quota)
	if s.Skew != 0 || now < s.Last {
		return l.stepBehind(s, now, n, charge)
	}
	return l.step(s, now, n, charge)
}

// maxDebt bounds a forced count, as MaxPeriod bounds a bucket's debt.
const maxDebt = 1 << 50

// logRoom returns how many units a forced charge may add to a sliding
// log that holds total: up to twice the Quota, so that no charge grows a
// log without bound (see Charge).
func (l *Spec) logRoom(total int64) int64 {
	return max(2*l.Quota-total, 0)
}

// mode is what a step does with its cost.
type mode uint8

const (
	take   mode = iota // charge n if every limit allows it
	charge             // charge n whatever the limit says (Charge)
	refund             // give n back (Refund)
)

// Refund gives n units back to the key: the opposite of a charge, exact,
// and never beyond the limit's quota. A bucket's TAT moves back by n
// emission intervals, but not before now (a full bucket stays full); a
// fixed window's count drops by n in the current window; a sliding
// window counter takes n from the current window's count, then from the
// previous one's; a sliding log drops its n newest units. Charging n and
// then refunding n leaves the State as if neither had happened, up to
// what time has restored meanwhile; a refund on a full key changes
// nothing. Commit the result with charged = true and a cost of -n.
func (l *Spec) Refund(s *State, now, n int64) (Verdict, Delta) {
	n = min(n, l.Quota)
	if s.Skew != 0 || now < s.Last {
		return l.stepBehind(s, now, n, refund)
	}
	return l.step(s, now, n, refund)
}

// step is Step at time t on the key's time line, in mode m.
func (l *Spec) step(s *State, t, n int64, m mode) (v Verdict, next Delta) {
	switch l.Kind {
	case Bucket:
		v, next = l.stepBucket(s, t, n, m)
	case Fixed:
		v, next = l.stepFixed(s, t, n, m)
	case Sliding:
		v, next = l.stepSliding(s, t, n, m)
	case Log:
		v, next = l.stepLog(s, t, n, m)
	}
	if n == 0 {
		v.Allowed, v.Retry = true, 0
	}
	next.T = t
	return v, next
}

// stepBehind is Step for a key whose time line runs ahead of the clock,
// or has just been stepped back: it is apart so that Step stays small.
func (l *Spec) stepBehind(s *State, now, n int64, m mode) (Verdict, Delta) {
	t, skew := l.timeline(s, now)
	if skew == 0 || !l.rejoin(s, now, skew) {
		return l.step(s, t, n, m)
	}
	// Nothing left to remember: back on the clock, from a fresh State.
	v, next := l.step(&State{}, now, n, m)
	if l.Kind == Log {
		next.A = int64(len(s.Log)) // drop every mark
	}
	return v, next
}

// timeline returns the time t at which the key's State is read for a
// request at now, and the key's skew with it: now + Skew, or, when that
// is before the latest charge (the clock stepped back), the latest charge,
// with the skew grown by the step. The skew is at most MaxPeriod, which
// keeps every time below 2^53; a longer step back reads the State at an
// earlier time, which takes capacity but never grants it.
//
// A calendar window follows the clock by definition (its days are the
// clock's days), so it keeps no skew: a step back keeps counting in the
// later window until the clock reaches it again.
func (l *Spec) timeline(s *State, now int64) (t, skew int64) {
	if l.Calendar != 0 {
		return now, 0
	}
	skew = s.Skew
	t = now + skew
	if t < s.Last {
		skew = min(s.Last-now, maxPeriodMicros)
		t = now + skew
	}
	return t, skew
}

// rejoin reports whether a key whose State s runs skew ahead of the
// clock may decide on the clock again at now, from a fresh State: when
// whatever s counted has ended by the clock too, so that the fresh State
// cannot count any of it a second time. A bucket must be full, a log's
// marks expired, and a window must have ended before the clock's window
// (for the sliding counter, the one before it) begins.
func (l *Spec) rejoin(s *State, now, skew int64) bool {
	end, start := int64(0), now
	switch l.Kind {
	case Bucket:
		end = s.A
		if s.B > 0 {
			end++
		}
	case Fixed:
		_, end = l.Window(s.A)
		start, _ = l.Window(now)
	case Sliding:
		end = s.A + 2*l.Period
		_, e := arith.FloorDiv(now, l.Period)
		start = now - e
	case Log:
		if k := len(s.Log); k > 0 {
			end = s.Log[k-1].At + l.Period
		}
	}
	return end-skew <= start
}

// Hold returns how long (µs) a store must keep a State that a charge at
// now left with the Verdict v and the Delta d. It is v.Reset, the time until
// the State is full again, except on a window that runs ahead of the
// clock, which is kept one Period longer: until it may rejoin the clock
// (see Step), so that a store that drops the State then decides as if it
// had kept it.
func (l *Spec) Hold(v Verdict, d Delta, now int64) int64 {
	if d.T > now && (l.Kind == Fixed || l.Kind == Sliding) {
		return v.Reset + l.Period
	}
	return v.Reset
}

// Commit applies the outcome of l.Step (or Charge, or Refund) at now to s;
// n is the cost, negative for a refund. charged says whether
// the request is charged (it was allowed by every limit and costs more
// than 0). A sliding log drops its expired marks either way.
//
// A request that is not charged still records a backward step of the
// clock (a Skew grown by Step), so that a key at its limit when the clock
// steps back refills as the clock moves on rather than waiting for the
// clock to catch up; a store writes the State then too.
func (l *Spec) Commit(s *State, next Delta, now, n int64, charged bool) {
	skew := next.T - now
	if l.Kind != Log {
		if charged {
			s.Kind, s.A, s.B, s.C = l.Kind, next.A, next.B, next.C
			s.Last, s.Skew = next.T, skew
		} else if skew > s.Skew && s.Kind == l.Kind {
			s.Skew = skew
		}
		return
	}
	if k := int(next.A); k > 0 {
		m := copy(s.Log, s.Log[k:])
		clear(s.Log[m:])
		s.Log = s.Log[:m]
	}
	s.Kind, s.C = Log, next.C
	if charged && n > 0 {
		// As stepLog: a forced charge adds what fits, and one that adds
		// nothing is no charge.
		n = min(n, l.logRoom(s.C))
		charged = n > 0
	}
	if charged && n < 0 {
		// A refund: the -n newest units go; the latest charge is then the
		// newest mark left.
		for left := -n; left > 0 && len(s.Log) > 0; {
			k := len(s.Log) - 1
			d := min(left, s.Log[k].N)
			s.Log[k].N -= d
			s.C -= d
			left -= d
			if s.Log[k].N == 0 {
				s.Log[k] = Mark{}
				s.Log = s.Log[:k]
			}
		}
		if k := len(s.Log); k > 0 {
			s.Last = s.Log[k-1].At
		} else {
			s.Last, s.Skew = 0, 0
		}
		return
	}
	if !charged {
		switch {
		case len(s.Log) == 0:
			s.Last, s.Skew = 0, 0
		case skew > s.Skew:
			s.Skew = skew
		}
		return
	}
	s.C += n
	// The log's latest charge is its newest mark (past the longest skew,
	// later than the time line; see timeline).
	s.Last, s.Skew = max(next.T, next.B), skew
	if last := len(s.Log) - 1; last >= 0 && s.Log[last].At == next.B {
		s.Log[last].N += n
	} else {
		s.Log = append(s.Log, Mark{next.B, n})
	}
}

// stepBucket is GCRA, which is also the token bucket and the leaky bucket
// (meter form). With emission interval T = period/rate and tolerance
// τ = quota*T, a key stores its TAT; a request of cost n computes
// new = max(TAT, now) + n*T and passes when new - τ <= now.
//
// T and τ are not rounded: TAT is kept as a whole number of microseconds
// plus a fraction in 1/rate microseconds, so 3 per second admits exactly 3
// per second forever, not 3.000003.
func (l *Spec) stepBucket(s *State, now, n int64, m mode) (v Verdict, next Delta) {
	R := l.Rate
	tat, f := s.A, s.B
	if s.C != R {
		// The rate changed since the State was written, so the fraction is
		// in other units: round TAT up (against the caller) and drop it.
		if f > 0 {
			tat++
		}
		f = 0
	}
	if tat < now {
		tat, f = now, 0
	}
	next.A, next.B, next.C = tat, f, R
	force := m == charge
	switch {
	case m == refund:
		// TAT moves back by n*T, but not before now: full stays full.
		iq, ir := arith.MulDiv(n, l.Period, R)
		nt, nf := tat-iq, f-ir
		if nf < 0 {
			nt, nf = nt-1, nf+R
		}
		if nt < now {
			nt, nf = now, 0
		}
		v.Allowed = true
		tat, f = nt, nf
		next.A, next.B = nt, nf
	case n > l.Quota:
		v.Retry = NeverMicros
	default:
		iq, ir := l.TQ, l.TR // n*T for the common n = 1, precomputed
		if n != 1 {
			iq, ir = arith.MulDiv(n, l.Period, R)
		}
		nt, nf := tat+iq, f+ir
		if nf >= R {
			nt, nf = nt+1, nf-R
		}
		lt, lf := now+l.TauQ, l.TauR // now + τ
		if force && nt > now+maxPeriodMicros {
			nt, nf = now+maxPeriodMicros, 0 // the most debt a key keeps
		}
		if force || nt < lt || (nt == lt && nf <= lf) {
			v.Allowed = true
			tat, f = nt, nf
			next.A, next.B = nt, nf
		} else {
			// Allowed once now + τ reaches new: retry = ceil(new - τ - now).
			dt, df := nt-lt, nf-lf
			if df < 0 {
				dt, df = dt-1, df+R
			}
			v.Retry = dt
			if df > 0 {
				v.Retry++
			}
		}
	}
	// remaining = floor((now + τ - TAT) / T) = floor((now + τ - TAT) * R / P)
	dt, df := now+l.TauQ-tat, l.TauR-f
	if df < 0 {
		dt, df = dt-1, df+R
	}
	if dt >= 0 {
		q, r := arith.MulDiv(dt, R, l.Period)
		v.Remaining = q + (r+df)/l.Period
	}
	// reset = ceil(TAT - now)
	if tat > now || (tat == now && f > 0) {
		v.Reset = tat - now
		if f > 0 {
			v.Reset++
		}
	}
	return v, next
}

// stepFixed is the fixed window counter. A State from a later window than
// now (the clock went backwards) keeps counting in that window: going back
// in time never opens a fresh window.
func (l *Spec) stepFixed(s *State, now, n int64, m mode) (v Verdict, next Delta) {
	start, end := l.Window(max(now, s.A))
	count := int64(0)
	if s.A == start {
		count = s.B
	}
	switch {
	case m == refund:
		v.Allowed = true
		count = max(count-n, 0)
	case n > l.Quota:
		v.Retry = NeverMicros
	case m == charge || count+n <= l.Quota:
		v.Allowed = true
		count = min(count+n, maxDebt)
	default:
		v.Retry = end - now
	}
	v.Remaining = max(l.Quota-count, 0)
	if count > 0 {
		v.Reset = end - now
	}
	next.A, next.B = start, count
	return v, next
}

// stepSliding is the sliding window counter. Windows of length W are
// aligned to the epoch; at offset e into the current window the count of
// the window ending now is estimated as
//
//	ceil(previous * (W - e) / W) + current
//
// and a request of cost n passes when estimate + n <= limit.
func (l *Spec) stepSliding(s *State, now, n int64, m mode) (v Verdict, next Delta) {
	W, L := l.Period, l.Quota
	t := max(now, s.A)
	_, e := arith.FloorDiv(t, W)
	cur := t - e
	var prev, curr int64
	switch s.A {
	case cur:
		prev, curr = s.B, s.C
	case cur - W:
		prev = s.C
	}
	if m == refund {
		// From the current window first, then from the previous one.
		d := min(curr, n)
		curr, prev = curr-d, max(prev-(n-d), 0)
	}
	q, r := arith.MulDiv(prev, W-e, W)
	est := q
	if r > 0 {
		est++
	}
	switch {
	case m == refund:
		v.Allowed = true
	case n > L:
		v.Retry = NeverMicros
	case m == charge || est+curr+n <= L:
		v.Allowed = true
		curr = min(curr+n, maxDebt)
	default:
		v.Retry = slidingAllowAt(cur, W, L, prev, curr, n) - now
	}
	v.Remaining = max(L-est-curr, 0)
	switch {
	case curr > 0:
		v.Reset = cur + 2*W - now
	case est > 0:
		v.Reset = cur + W - now
	}
	next.A, next.B, next.C = cur, prev, curr
	return v, next
}

// slidingAllowAt returns the first time (µs) at which a request of cost
// n <= L, denied now in the window starting at cur, would pass if nothing
// else is admitted meanwhile.
func slidingAllowAt(cur, W, L, prev, curr, n int64) int64 {
	if need := L - curr - n; need >= 0 {
		// Later in this window: ceil(prev*(W-e)/W) <= need
		// <=> e >= W - floor(need*W/prev).
		q, _ := arith.MulDiv(need, W, prev)
		return cur + W - q
	}
	// In the next window the current count becomes the previous one:
	// ceil(curr*(W-e)/W) <= L-n <=> e >= W - floor((L-n)*W/curr).
	q, _ := arith.MulDiv(L-n, W, curr)
	return cur + W + W - min(q, W)
}

// stepLog is the sliding window log: the exact count of units admitted in
// (now - W, now]. Its time never goes backwards: now is taken as at least
// the newest Mark, so a clock that jumps back cannot make marks expire
// early.
func (l *Spec) stepLog(s *State, now, n int64, m mode) (v Verdict, next Delta) {
	W, L := l.Period, l.Quota
	t := now
	if k := len(s.Log); k > 0 && s.Log[k-1].At > t {
		t = s.Log[k-1].At
	}
	// Marks at or before t - W have expired; they are the oldest.
	lo, hi := 0, len(s.Log)
	for lo < hi {
		mid := int(uint(lo+hi) >> 1)
		if s.Log[mid].At <= t-W {
			lo = mid + 1
		} else {
			hi = mid
		}
	}
	total := s.C
	for _, m := range s.Log[:lo] {
		total -= m.N
	}
	count := total
	if m == charge {
		n = min(n, l.logRoom(total)) // see Commit
	}
	switch {
	case m == refund:
		v.Allowed = true
		count = max(total-n, 0)
	case n > L:
		v.Retry = NeverMicros
	case m == charge || total+n <= L:
		v.Allowed = true
		count += n
	default:
		// Wait until the oldest total+n-L units have expired.
		need := total + n - L
		for _, mk := range s.Log[lo:] {
			if need -= mk.N; need <= 0 {
				v.Retry = mk.At + W - now
				break
			}
		}
	}
	v.Remaining = max(L-count, 0)
	switch {
	case m == refund:
		// The newest mark that keeps a unit after the n newest go.
		if count > 0 {
			k, left := len(s.Log), n
			for left >= s.Log[k-1].N {
				left -= s.Log[k-1].N
				k--
			}
			v.Reset = s.Log[k-1].At + W - now
		}
	case v.Allowed && n > 0:
		v.Reset = t + W - now
	case total > 0:
		v.Reset = s.Log[len(s.Log)-1].At + W - now
	}
	next.A, next.B, next.C = int64(lo), t, total
	return v, next
}
