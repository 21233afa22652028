package httplimit

import (
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"strings"
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
// address, as "ip:<address>". IPv6 clients are keyed by their /64, which
// one subscriber usually holds whole ("ip:2001:db8:1:2::/64").
//
// The client is the peer of the connection (Request.RemoteAddr) unless
// that peer is one of the trusted proxies. Only then are the forwarding
// headers read: Forwarded (RFC 7239) if present, else X-Forwarded-For,
// walked from the nearest hop back, skipping trusted proxies; the first
// address that is not trusted is the client. Headers from an untrusted
// peer are never read, so a client cannot choose its own key. With no
// trusted proxies, ClientIP is the peer's address.
func ClientIP(trusted ...netip.Prefix) KeyFunc {
	isTrusted := func(a netip.Addr) bool {
		for _, p := range trusted {
			if p.Contains(a) {
				return true
			}
		}
		return false
	}
	return func(r *http.Request) (string, error) {
		peer, err := parseHost(r.RemoteAddr)
		if err != nil {
			return "", fmt.Errorf("no client address: %w", err)
		}
		client := peer
		if len(trusted) > 0 && isTrusted(peer) {
			hops := forwardedFor(r.Header)
			for i := len(hops) - 1; i >= 0; i-- {
				a, err := parseHost(hops[i])
				if err != nil {
					break // a hop we cannot read: stop at the last trusted one
				}
				client = a
				if !isTrusted(a) {
					break
				}
			}
		}
		return IPKey(client), nil
	}
}

// IPKey returns the key of a client address, as ClientIP makes it:
// "ip:<IPv4 address>", or "ip:<the /64 prefix>" for IPv6.
func IPKey(a netip.Addr) string {
	a = a.Unmap()
	if a.Is4() {
		return "ip:" + a.String()
	}
	p, _ := a.Prefix(64)
	return "ip:" + p.String()
}

// parseHost parses an address with or without a port, in brackets or not:
// "192.0.2.1", "192.0.2.1:80", "[2001:db8::1]:443", "2001:db8::1".
func parseHost(s string) (netip.Addr, error) {
	s = strings.TrimSpace(s)
	if ap, err := netip.ParseAddrPort(s); err == nil {
		return ap.Addr().Unmap(), nil
	}
	if host, _, err := net.SplitHostPort(s); err == nil {
		s = host
	}
	s = strings.TrimSuffix(strings.TrimPrefix(s, "["), "]")
	a, err := netip.ParseAddr(s)
	if err != nil {
		return netip.Addr{}, err
	}
	return a.Unmap(), nil
}

// forwardedFor returns the hops of Forwarded's for= parameters, or of
// X-Forwarded-For when there is no Forwarded field, nearest hop last.
func forwardedFor(h http.Header) []string {
	var hops []string
	if fwd := h.Values("Forwarded"); len(fwd) > 0 {
		for _, line := range fwd {
			for _, elem := range strings.Split(line, ",") {
				hop := "unknown"
				for _, pair := range strings.Split(elem, ";") {
					k, v, ok := strings.Cut(strings.TrimSpace(pair), "=")
					if ok && strings.EqualFold(k, "for") {
						hop = strings.Trim(v, `"`)
					}
				}
				hops = append(hops, hop)
			}
		}
		return hops
	}
	for _, line := range h.Values("X-Forwarded-For") {
		for _, hop := range strings.Split(line, ",") {
			hops = append(hops, strings.TrimSpace(hop))
		}
	}
	return hops
}

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
