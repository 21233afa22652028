// Package headers formats the RateLimit header fields of
// draft-ietf-httpapi-ratelimit-headers-10 for the HTTP middleware, the
// gRPC interceptors (as metadata) and any other surface:
//
//	RateLimit-Policy: "burst";q=100;w=60
//	RateLimit: "burst";r=99;t=1
package headers

import (
	"strconv"
	"strings"
	"time"

	"github.com/floodgate/floodgate"
	"github.com/floodgate/floodgate/internal/lib/arith"
)

// Name returns the name that headers, problem details and metrics give
// the limit at index of count limits, whose own Name is name: that name,
// or "default" for a single unnamed limit, or "limit-<index>". Characters
// that a Structured Field string cannot hold are replaced by "_".
func Name(name string, index, count int) string {
	if name == "" {
		if count == 1 {
			return "default"
		}
		return "limit-" + strconv.Itoa(index)
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

// Seconds is d in whole seconds, rounded up, as every header and
// CL.THROTTLE report it; -1 for floodgate.Never.
func Seconds(d time.Duration) int64 { return arith.RoundUp(d, time.Second) }

// Policy returns the RateLimit-Policy field value for limits, one item per
// limit: "name";q=<quota>;w=<seconds>, where w is the limit's Span.
func Policy(limits []floodgate.Limit) string {
	var b strings.Builder
	for i, l := range limits {
		if i > 0 {
			b.WriteString(", ")
		}
		sfString(&b, Name(l.Name(), i, len(limits)))
		b.WriteString(";q=")
		b.WriteString(strconv.FormatInt(l.Quota(), 10))
		b.WriteString(";w=")
		b.WriteString(strconv.FormatInt(Seconds(l.Span()), 10))
	}
	return b.String()
}

// RateLimit returns the RateLimit field value for a result of a Limiter of
// count limits: "name";r=<remaining>;t=<seconds>, for the limit the result
// describes. t is the seconds until that limit is full again when the
// request was allowed, and until the request could pass (Retry-After) when
// it was denied, so that t never comes after Retry-After.
func RateLimit(res floodgate.Result, count int) string {
	var b strings.Builder
	sfString(&b, Name(res.Name, res.Index, count))
	b.WriteString(";r=")
	b.WriteString(strconv.FormatInt(res.Remaining, 10))
	b.WriteString(";t=")
	t := res.ResetAfter
	if !res.Allowed && res.RetryAfter != floodgate.Never {
		t = res.RetryAfter
	}
	b.WriteString(strconv.FormatInt(Seconds(t), 10))
	return b.String()
}
