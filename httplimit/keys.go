package httplimit

import (
	"errors"
	"fmt"
	"net/http"
	"net/netip"

	"github.com/floodgate/floodgate/internal/lib/clientip"
)

// KeyFunc returns the rate limit key of a request. An error makes the
// middleware answer 400 Bad Request with the error's text.
type KeyFunc func(r *http.Request) (string, error)

// TrustedProxies parses the addresses of the proxies whose forwarding
// headers ClientIP may believe: CIDR prefixes ("10.0.0.0/8") or single
// addresses ("192.0.2.7", "::1").
func TrustedProxies(addrs ...string) ([]netip.Prefix, error) {
	out := make([]netip.Prefix, 0, len(addrs))
	for _, a := range addrs {
		if p, err := netip.ParsePrefix(a); err == nil {
			out = append(out, p.Masked())
			continue
		}
		ip, err := netip.ParseAddr(a)
		if err != nil {
			return nil, fmt.Errorf("httplimit: trusted proxy %q is neither an address nor a CIDR prefix", a)
		}
		ip = ip.Unmap()
		out = append(out, netip.PrefixFrom(ip, ip.BitLen()))
	}
	return out, nil
}

// ClientIP returns a KeyFunc that keys a request by its client's IP
// address, read from X-Forwarded-For behind trusted proxies: it is
// ClientIPFromHeader("X-Forwarded-For", trusted...). With no trusted
// proxies, it keys by the connection's peer.
func ClientIP(trusted ...netip.Prefix) KeyFunc {
	r, _ := clientip.New(clientip.XForwardedFor, trusted) // a valid header
	return clientIP(r)
}

// ClientIPFromHeader returns a KeyFunc that keys a request by its client's
// IP address, as "ip:<address>". IPv6 clients are keyed by their /64,
// which one subscriber usually holds whole ("ip:2001:db8:1:2::/64").
//
// The client is the peer of the connection (Request.RemoteAddr) unless
// that peer is one of the trusted proxies. Only then is header read, and
// only header: the one the proxies write, "X-Forwarded-For" (each proxy
// appends the address it received from), "Forwarded" (RFC 7239's for=)
// or "X-Real-IP" (one address, set by the nearest proxy). Its hops are
// walked from the nearest back, skipping trusted proxies; the first
// address that is not trusted is the client. A client cannot choose its
// own key: headers from an untrusted peer are never read, the hops a
// client prepends are behind the ones the proxies append, and a header
// the proxies do not write (a forged Forwarded behind proxies that append
// X-Forwarded-For) is ignored. It fails for any other header.
func ClientIPFromHeader(header string, trusted ...netip.Prefix) (KeyFunc, error) {
	r, err := clientip.New(header, trusted)
	if err != nil {
		return nil, fmt.Errorf("httplimit: %w", err)
	}
	return clientIP(r), nil
}

func clientIP(res *clientip.Resolver) KeyFunc {
	header := res.Header()
	return func(r *http.Request) (string, error) {
		peer, err := clientip.ParseHost(r.RemoteAddr)
		if err != nil {
			return "", fmt.Errorf("no client address: %w", err)
		}
		return clientip.Key(res.Client(peer, r.Header.Values(header))), nil
	}
}

// IPKey returns the key of a client address, as ClientIP makes it:
// "ip:<IPv4 address>", or "ip:<the /64 prefix>" for IPv6.
func IPKey(a netip.Addr) string { return clientip.Key(a) }

// ErrNoKey is returned by the KeyFunc of Header when the header is
// missing.
var ErrNoKey = errors.New("httplimit: the request has no rate limit key")

// Header returns a KeyFunc that keys a request by the value of a header,
// such as an API key, as "<name>:<value>". A request without the header
// is keyed by otherwise, or refused with 400 and ErrNoKey when otherwise
// is nil.
func Header(name string, otherwise KeyFunc) KeyFunc {
	canon := http.CanonicalHeaderKey(name)
	return func(r *http.Request) (string, error) {
		if v := r.Header.Get(canon); v != "" {
			return canon + ":" + v, nil
		}
		if otherwise != nil {
			return otherwise(r)
		}
		return "", fmt.Errorf("%w: header %s is missing", ErrNoKey, canon)
	}
}
