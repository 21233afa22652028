package core

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
type State struct {
	Kind    Kind
	A, B, C int64
	Log     []Mark
}

// Delta is what Step computes for Commit to apply: a State without the
// sliding log's marks, small enough to come back in registers with the
// Verdict, which matters on the hot path. For Log it is not a state but
// the change to make: A = marks to drop from the front, B = the time to
// record, C = the total left after dropping.
type Delta struct {
	Kind    Kind
	A, B, C int64
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
func (l *Spec) Step(s *State, now, n int64) (Verdict, Delta) {
	var v Verdict
	var next Delta
	switch l.Kind {
	case Bucket:
		v, next = l.stepBucket(s, now, n)
	case Fixed:
		v, next = l.stepFixed(s, now, n)
	case Sliding:
		v, next = l.stepSliding(s, now, n)
	case Log:
		v, next = l.stepLog(s, now, n)
	}
	if n == 0 {
		v.Allowed, v.Retry = true, 0
	}
	next.Kind = l.Kind
	return v, next
}

// Commit applies the outcome of Step to s. charged says whether the
// request is charged (it was allowed by every limit and costs more than
// 0). A sliding log drops its expired marks either way.
func Commit(s *State, next Delta, n int64, charged bool) {
	if next.Kind != Log {
		if charged {
			s.Kind, s.A, s.B, s.C = next.Kind, next.A, next.B, next.C
		}
		return
	}
	if k := int(next.A); k > 0 {
		m := copy(s.Log, s.Log[k:])
		clear(s.Log[m:])
		s.Log = s.Log[:m]
	}
	s.Kind, s.C = Log, next.C
	if !charged {
		return
	}
	s.C += n
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
func (l *Spec) stepBucket(s *State, now, n int64) (Verdict, Delta) {
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
	var v Verdict
	next := Delta{A: tat, B: f, C: R}
	if n > l.Quota {
		v.Retry = NeverMicros
	} else {
		iq, ir := l.TQ, l.TR // n*T for the common n = 1, precomputed
		if n != 1 {
			iq, ir = MulDiv(n, l.Period, R)
		}
		nt, nf := tat+iq, f+ir
		if nf >= R {
			nt, nf = nt+1, nf-R
		}
		lt, lf := now+l.TauQ, l.TauR // now + τ
		if nt < lt || (nt == lt && nf <= lf) {
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
		q, r := MulDiv(dt, R, l.Period)
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
func (l *Spec) stepFixed(s *State, now, n int64) (Verdict, Delta) {
	start, end := l.Window(max(now, s.A))
	count := int64(0)
	if s.A == start {
		count = s.B
	}
	var v Verdict
	switch {
	case n > l.Quota:
		v.Retry = NeverMicros
	case count+n <= l.Quota:
		v.Allowed = true
		count += n
	default:
		v.Retry = end - now
	}
	v.Remaining = max(l.Quota-count, 0)
	if count > 0 {
		v.Reset = end - now
	}
	return v, Delta{A: start, B: count}
}

// stepSliding is the sliding window counter. Windows of length W are
// aligned to the epoch; at offset e into the current window the count of
// the window ending now is estimated as
//
//	ceil(previous * (W - e) / W) + current
//
// and a request of cost n passes when estimate + n <= limit.
func (l *Spec) stepSliding(s *State, now, n int64) (Verdict, Delta) {
	W, L := l.Period, l.Quota
	t := max(now, s.A)
	_, e := FloorDiv(t, W)
	cur := t - e
	var prev, curr int64
	switch s.A {
	case cur:
		prev, curr = s.B, s.C
	case cur - W:
		prev = s.C
	}
	q, r := MulDiv(prev, W-e, W)
	est := q
	if r > 0 {
		est++
	}
	var v Verdict
	switch {
	case n > L:
		v.Retry = NeverMicros
	case est+curr+n <= L:
		v.Allowed = true
		curr += n
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
	return v, Delta{A: cur, B: prev, C: curr}
}

// slidingAllowAt returns the first time (µs) at which a request of cost
// n <= L, denied now in the window starting at cur, would pass if nothing
// else is admitted meanwhile.
func slidingAllowAt(cur, W, L, prev, curr, n int64) int64 {
	if need := L - curr - n; need >= 0 {
		// Later in this window: ceil(prev*(W-e)/W) <= need
		// <=> e >= W - floor(need*W/prev).
		q, _ := MulDiv(need, W, prev)
		return cur + W - q
	}
	// In the next window the current count becomes the previous one:
	// ceil(curr*(W-e)/W) <= L-n <=> e >= W - floor((L-n)*W/curr).
	q, _ := MulDiv(L-n, W, curr)
	return cur + W + W - min(q, W)
}

// stepLog is the sliding window log: the exact count of units admitted in
// (now - W, now]. Its time never goes backwards: now is taken as at least
// the newest Mark, so a clock that jumps back cannot make marks expire
// early.
func (l *Spec) stepLog(s *State, now, n int64) (Verdict, Delta) {
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
	var v Verdict
	count := total
	switch {
	case n > L:
		v.Retry = NeverMicros
	case total+n <= L:
		v.Allowed = true
		count += n
	default:
		// Wait until the oldest total+n-L units have expired.
		need := total + n - L
		for _, m := range s.Log[lo:] {
			if need -= m.N; need <= 0 {
				v.Retry = m.At + W - now
				break
			}
		}
	}
	v.Remaining = max(L-count, 0)
	switch {
	case v.Allowed && n > 0:
		v.Reset = t + W - now
	case total > 0:
		v.Reset = s.Log[len(s.Log)-1].At + W - now
	}
	return v, Delta{A: int64(lo), B: t, C: total}
}
