package httplimit

import (
	"math/bits"
	"strconv"
	"strings"
	"time"

	"github.com/floodgate/floodgate"
)

// The header fields the middleware writes.
const (
	HeaderPolicy     = "RateLimit-Policy"
	HeaderRateLimit  = "RateLimit"
	HeaderRetryAfter = "Retry-After"
	HeaderLimit      = "X-RateLimit-Limit"
	HeaderRemaining  = "X-RateLimit-Remaining"
	HeaderReset      = "X-RateLimit-Reset"
)

// PolicyName returns the name that headers, problem details and metrics
// give limits[i]: its Name, or "default" for a single unnamed limit, or
// "limit-<i>". Characters that a Structured Field string cannot hold are
// replaced by "_".
func PolicyName(limits []floodgate.Limit, i int) string {
	name := limits[i].Name()
	if name == "" {
		if len(limits) == 1 {
			return "default"
		}
		return "limit-" + strconv.Itoa(i)
	}
	return strings.Map(func(r rune) rune {
		if r < 0x20 || r > 0x7e {
			return '_'
		}
		return r
	}, name)
}

// sfString writes s as a Structured Field string (RFC 9651 section 3.3.3):
// quoted, with \ and " escaped.
func sfString(b *strings.Builder, s string) {
	b.WriteByte('"')
	for i := 0; i < len(s); i++ {
		if s[i] == '"' || s[i] == '\\' {
			b.WriteByte('\\')
		}
		b.WriteByte(s[i])
	}
	b.WriteByte('"')
}

// Seconds returns d in whole seconds, rounded up: the rule of every
// header and of CL.THROTTLE. It returns -1 for floodgate.Never.
func Seconds(d time.Duration) int64 {
	if d == floodgate.Never {
		return -1
	}
	if d <= 0 {
		return 0
	}
	s := int64(d / time.Second)
	if d%time.Second != 0 {
		s++
	}
	return s
}

// window is the policy window of a limit in whole seconds, rounded up:
// the window's length, or for the bucket algorithms the time a bucket
// takes to refill from empty (Quota * Period / Rate), so that q per w is
// both the burst and the long-run rate.
func window(l floodgate.Limit) int64 {
	switch l.Algorithm() {
	case floodgate.AlgorithmTokenBucket, floodgate.AlgorithmLeakyBucket, floodgate.AlgorithmGCRA:
		// Quota * Period / Rate microseconds, rounded up. A valid Limit
		// keeps the quotient below 2^48, so Div64 cannot overflow.
		hi, lo := bits.Mul64(uint64(l.Quota()), uint64(l.Period().Microseconds()))
		us, rem := bits.Div64(hi, lo, uint64(l.Rate()))
		if rem != 0 {
			us++
		}
		return Seconds(time.Duration(us) * time.Microsecond)
	}
	return Seconds(l.Period())
}

// PolicyHeader returns the RateLimit-Policy field value for limits, one
// item per limit: "name";q=<quota>;w=<window seconds>. See window for the
// buckets' window.
func PolicyHeader(limits []floodgate.Limit) string {
	var b strings.Builder
	for i, l := range limits {
		if i > 0 {
			b.WriteString(", ")
		}
		sfString(&b, PolicyName(limits, i))
		b.WriteString(";q=")
		b.WriteString(strconv.FormatInt(l.Quota(), 10))
		b.WriteString(";w=")
		b.WriteString(strconv.FormatInt(window(l), 10))
	}
	return b.String()
}

// RateLimitHeader returns the RateLimit field value for a result:
// "name";r=<remaining>;t=<seconds>, for the limit the result describes.
// t is the seconds until that limit is full again when the request was
// allowed, and until the request could pass (Retry-After) when it was
// denied, so that t never comes after Retry-After.
func RateLimitHeader(limits []floodgate.Limit, res floodgate.Result) string {
	var b strings.Builder
	sfString(&b, PolicyName(limits, res.Index))
	b.WriteString(";r=")
	b.WriteString(strconv.FormatInt(res.Remaining, 10))
	b.WriteString(";t=")
	b.WriteString(strconv.FormatInt(resetSeconds(res), 10))
	return b.String()
}

func resetSeconds(res floodgate.Result) int64 {
	if !res.Allowed && res.RetryAfter != floodgate.Never {
		return Seconds(res.RetryAfter)
	}
	return Seconds(res.ResetAfter)
}
