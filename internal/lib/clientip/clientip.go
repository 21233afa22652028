// Package clientip finds a request's client address behind trusted
// proxies, from the one header those proxies write, for the HTTP
// middleware and the gRPC interceptors alike.
package clientip

import (
	"fmt"
	"net"
	"net/netip"
	"strings"
)

// The headers that proxies write the client's address into.
const (
	// XForwardedFor is a comma-separated list of hops, each proxy
	// appending the address it received the request from.
	XForwardedFor = "X-Forwarded-For"
	// Forwarded is RFC 7239's list of elements, whose for= parameters are
	// the hops.
	Forwarded = "Forwarded"
	// XRealIP is one address: the client as the nearest proxy saw it.
	XRealIP = "X-Real-IP"
)

// Resolver finds client addresses from one header behind trusted
// proxies.
type Resolver struct {
	header  string // canonical: one of the constants
	trusted []netip.Prefix
}

// New returns a Resolver that reads header (XForwardedFor when empty, in
// any case) when the peer is one of trusted, and never otherwise.
func New(header string, trusted []netip.Prefix) (*Resolver, error) {
	switch {
	case header == "", strings.EqualFold(header, XForwardedFor):
		header = XForwardedFor
	case strings.EqualFold(header, Forwarded):
		header = Forwarded
	case strings.EqualFold(header, XRealIP):
		header = XRealIP
	default:
		return nil, fmt.Errorf("the client address header must be %s, %s or %s, got %q", XForwardedFor, Forwarded, XRealIP, header)
	}
	return &Resolver{header: header, trusted: trusted}, nil
}

// Header returns the header the Resolver reads, in its canonical form.
func (r *Resolver) Header() string { return r.header }

func (r *Resolver) isTrusted(a netip.Addr) bool {
	for _, p := range r.trusted {
		if p.Contains(a) {
			return true
		}
	}
	return false
}

// Client returns the client's address of a request from peer whose
// header lines, in order, are values. The peer is the client unless it is
// trusted. Then the header's hops are walked from the nearest back,
// skipping trusted proxies: the first address that is not trusted is the
// client. A hop that is not an address ("unknown", an obfuscated name)
// stops the walk at the last address read. X-Real-IP holds one hop.
func (r *Resolver) Client(peer netip.Addr, values []string) netip.Addr {
	peer = peer.Unmap()
	if len(r.trusted) == 0 || !r.isTrusted(peer) {
		return peer
	}
	hops := r.hops(values)
	client := peer
	for i := len(hops) - 1; i >= 0; i-- {
		a, err := ParseHost(hops[i])
		if err != nil {
			break
		}
		client = a
		if !r.isTrusted(a) {
			break
		}
	}
	return client
}

// hops returns the header's hops, nearest last.
func (r *Resolver) hops(values []string) []string {
	var hops []string
	switch r.header {
	case XRealIP:
		if len(values) > 0 {
			hops = append(hops, values[len(values)-1])
		}
	case Forwarded:
		for _, line := range values {
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
	default:
		for _, line := range values {
			for _, hop := range strings.Split(line, ",") {
				hops = append(hops, strings.TrimSpace(hop))
			}
		}
	}
	return hops
}

// ParseHost parses an address with or without a port, in brackets or not:
// "192.0.2.1", "192.0.2.1:80", "[2001:db8::1]:443", "2001:db8::1".
func ParseHost(s string) (netip.Addr, error) {
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

// Key returns the rate limit key of a client address: "ip:<IPv4 address>",
// or "ip:<the /64 prefix>" for IPv6, which one subscriber usually holds
// whole.
func Key(a netip.Addr) string {
	a = a.Unmap()
	if a.Is4() {
		return "ip:" + a.String()
	}
	p, _ := a.Prefix(64)
	return "ip:" + p.String()
}
