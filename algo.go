package floodgate

import "time"

// This file holds the algorithms as pure functions of (state, limit, now,
// cost): no I/O, no clock, no allocation. Each is mirrored by a Lua script
// in the Redis store, and the conformance and differential tests demand
// that both give identical results.
//
// Every step function returns the verdict and the state to store if the
// request is charged; it never modifies the state it is given, so a store
// can check several limits and charge them only if all allow. commit then
// applies the new state.

// kind groups the algorithms by the shape of their state.
type kind uint8

const (
	kindNone    kind = iota
	kindBucket       // token bucket, leaky bucket, GCRA: a theoretical arrival time
	kindFixed        // fixed window: window start and count
	kindSliding      // sliding window counter: window start, previous and current counts
	kindLog          // sliding window log: the admitted units' timestamps
)

func (a Algorithm) kind() kind {
	switch a {
	case AlgorithmTokenBucket, AlgorithmLeakyBucket, AlgorithmGCRA:
		return kindBucket
	case AlgorithmFixedWindow:
		return kindFixed
	case AlgorithmSlidingWindow:
		return kindSliding
	case AlgorithmSlidingLog:
		return kindLog
	}
	return kindNone
}

// state is one limit's stored state on one key. The zero state (of any
// kind) means "full": nothing has been admitted recently.
//
//	kindBucket:  a = TAT (theoretical arrival time) in µs, b = its fraction
//	             in 1/c µs, c = the rate the fraction is counted in
//	kindFixed:   a = window start in µs, b = count admitted in it
//	kindSliding: a = current window start in µs, b = previous window's
//	             count, c = current window's count
//	kindLog:     log = admitted units, oldest first; c = their total
//
// For kindLog the state returned by step is not a state but the change to
// make: a = marks to drop from the front, b = the time to record, c = the
// total left after dropping.
type state struct {
	kind    kind
	a, b, c int64
	log     []mark
}

// delta is what step computes for commit to apply: a state without the
// sliding log's marks. It is small enough to come back in registers, with
// the verdict, which matters on the hot path.
type delta struct {
	kind    kind
	a, b, c int64
}

// mark is one entry of a sliding log: n units admitted at time at (µs).
type mark struct{ at, n int64 }

// step decides a request of cost n >= 0 at time now (µs) against l, given
// the key's state s for l. A cost of 0 is a peek: always allowed, never
// charged.
func (l *Limit) step(s *state, now, n int64) (verdict, delta) {
	var v verdict
	var next delta
	switch l.alg.kind() {
	case kindBucket:
		v, next = l.stepBucket(s, now, n)
	case kindFixed:
		v, next = l.stepFixed(s, now, n)
	case kindSliding:
		v, next = l.stepSliding(s, now, n)
	case kindLog:
		v, next = l.stepLog(s, now, n)
	}
	if n == 0 {
		v.allowed, v.retry = true, 0
	}
	next.kind = l.alg.kind()
	return v, next
}

// commit applies the outcome of step to s. charged says whether the
// request is charged (it was allowed by every limit and costs more than
// 0). A sliding log drops its expired marks either way.
func commit(s *state, next delta, n int64, charged bool) {
	if next.kind != kindLog {
		if charged {
			s.kind, s.a, s.b, s.c = next.kind, next.a, next.b, next.c
		}
		return
	}
	if k := int(next.a); k > 0 {
		m := copy(s.log, s.log[k:])
		clear(s.log[m:])
		s.log = s.log[:m]
	}
	s.kind, s.c = kindLog, next.c
	if !charged {
		return
	}
	s.c += n
	if last := len(s.log) - 1; last >= 0 && s.log[last].at == next.b {
		s.log[last].n += n
	} else {
		s.log = append(s.log, mark{next.b, n})
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
func (l *Limit) stepBucket(s *state, now, n int64) (verdict, delta) {
	R := l.rate
	tat, f := s.a, s.b
	if s.c != R {
		// The rate changed since the state was written, so the fraction is
		// in other units: round TAT up (against the caller) and drop it.
		if f > 0 {
			tat++
		}
		f = 0
	}
	if tat < now {
		tat, f = now, 0
	}
	var v verdict
	next := delta{a: tat, b: f, c: R}
	if n > l.quota {
		v.retry = never
	} else {
		iq, ir := l.tq, l.tr // n*T for the common n = 1, precomputed
		if n != 1 {
			iq, ir = mulDiv(n, l.period, R)
		}
		nt, nf := tat+iq, f+ir
		if nf >= R {
			nt, nf = nt+1, nf-R
		}
		lt, lf := now+l.tauQ, l.tauR // now + τ
		if nt < lt || (nt == lt && nf <= lf) {
			v.allowed = true
			tat, f = nt, nf
			next.a, next.b = nt, nf
		} else {
			// Allowed once now + τ reaches new: retry = ceil(new - τ - now).
			dt, df := nt-lt, nf-lf
			if df < 0 {
				dt, df = dt-1, df+R
			}
			v.retry = dt
			if df > 0 {
				v.retry++
			}
		}
	}
	// remaining = floor((now + τ - TAT) / T) = floor((now + τ - TAT) * R / P)
	dt, df := now+l.tauQ-tat, l.tauR-f
	if df < 0 {
		dt, df = dt-1, df+R
	}
	if dt >= 0 {
		q, r := mulDiv(dt, R, l.period)
		v.remaining = q + (r+df)/l.period
	}
	// reset = ceil(TAT - now)
	if tat > now || (tat == now && f > 0) {
		v.reset = tat - now
		if f > 0 {
			v.reset++
		}
	}
	return v, next
}

// stepFixed is the fixed window counter. A state from a later window than
// now (the clock went backwards) keeps counting in that window: going back
// in time never opens a fresh window.
func (l *Limit) stepFixed(s *state, now, n int64) (verdict, delta) {
	start, end := l.window(max(now, s.a))
	count := int64(0)
	if s.a == start {
		count = s.b
	}
	var v verdict
	switch {
	case n > l.quota:
		v.retry = never
	case count+n <= l.quota:
		v.allowed = true
		count += n
	default:
		v.retry = end - now
	}
	v.remaining = max(l.quota-count, 0)
	if count > 0 {
		v.reset = end - now
	}
	return v, delta{a: start, b: count}
}

// window returns the fixed window [start, end) that contains t, in µs.
func (l *Limit) window(t int64) (start, end int64) {
	if l.cal == 0 {
		_, off := floorDiv(t, l.period)
		return t - off, t - off + l.period
	}
	s, e := calendarWindow(time.UnixMicro(t).In(l.loc), l.cal)
	return s.UnixMicro(), e.UnixMicro()
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

// stepSliding is the sliding window counter. Windows of length W are
// aligned to the epoch; at offset e into the current window the count of
// the window ending now is estimated as
//
//	ceil(previous * (W - e) / W) + current
//
// and a request of cost n passes when estimate + n <= limit.
func (l *Limit) stepSliding(s *state, now, n int64) (verdict, delta) {
	W, L := l.period, l.quota
	t := max(now, s.a)
	_, e := floorDiv(t, W)
	cur := t - e
	var prev, curr int64
	switch s.a {
	case cur:
		prev, curr = s.b, s.c
	case cur - W:
		prev = s.c
	}
	q, r := mulDiv(prev, W-e, W)
	est := q
	if r > 0 {
		est++
	}
	var v verdict
	switch {
	case n > L:
		v.retry = never
	case est+curr+n <= L:
		v.allowed = true
		curr += n
	default:
		v.retry = slidingAllowAt(cur, W, L, prev, curr, n) - now
	}
	v.remaining = max(L-est-curr, 0)
	switch {
	case curr > 0:
		v.reset = cur + 2*W - now
	case est > 0:
		v.reset = cur + W - now
	}
	return v, delta{a: cur, b: prev, c: curr}
}

// slidingAllowAt returns the first time (µs) at which a request of cost
// n <= L, denied now in the window starting at cur, would pass if nothing
// else is admitted meanwhile.
func slidingAllowAt(cur, W, L, prev, curr, n int64) int64 {
	if need := L - curr - n; need >= 0 {
		// Later in this window: ceil(prev*(W-e)/W) <= need
		// <=> e >= W - floor(need*W/prev).
		q, _ := mulDiv(need, W, prev)
		return cur + W - q
	}
	// In the next window the current count becomes the previous one:
	// ceil(curr*(W-e)/W) <= L-n <=> e >= W - floor((L-n)*W/curr).
	q, _ := mulDiv(L-n, W, curr)
	return cur + W + W - min(q, W)
}

// stepLog is the sliding window log: the exact count of units admitted in
// (now - W, now]. Its time never goes backwards: now is taken as at least
// the newest mark, so a clock that jumps back cannot make marks expire
// early.
func (l *Limit) stepLog(s *state, now, n int64) (verdict, delta) {
	W, L := l.period, l.quota
	t := now
	if k := len(s.log); k > 0 && s.log[k-1].at > t {
		t = s.log[k-1].at
	}
	// Marks at or before t - W have expired; they are the oldest.
	lo, hi := 0, len(s.log)
	for lo < hi {
		mid := int(uint(lo+hi) >> 1)
		if s.log[mid].at <= t-W {
			lo = mid + 1
		} else {
			hi = mid
		}
	}
	total := s.c
	for _, m := range s.log[:lo] {
		total -= m.n
	}
	var v verdict
	count := total
	switch {
	case n > L:
		v.retry = never
	case total+n <= L:
		v.allowed = true
		count += n
	default:
		// Wait until the oldest total+n-L units have expired.
		need := total + n - L
		for _, m := range s.log[lo:] {
			if need -= m.n; need <= 0 {
				v.retry = m.at + W - now
				break
			}
		}
	}
	v.remaining = max(L-count, 0)
	switch {
	case v.allowed && n > 0:
		v.reset = t + W - now
	case total > 0:
		v.reset = s.log[len(s.log)-1].at + W - now
	}
	return v, delta{a: int64(lo), b: t, c: total}
}
