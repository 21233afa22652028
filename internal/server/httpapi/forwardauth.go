package httpapi

import (
	"errors"
	"fmt"
	"net/http"
	"net/netip"
	"net/url"
	"path"
	"strconv"
	"strings"

	"github.com/floodgate/floodgate"
	"github.com/floodgate/floodgate/internal/lib/clientip"
	"github.com/floodgate/floodgate/internal/lib/headers"
	"github.com/floodgate/floodgate/internal/server/service"
)

// The forward auth endpoint, /v1/auth/{rule} (or /v1/auth with the rule in
// RuleHeader), is what a proxy asks before it forwards a request: nginx's
// auth_request, Caddy's forward_auth, Traefik's ForwardAuth. Its query:
//
//	key   the key template (default "{ip}"), see parseKeyTemplate
//	deny  the status of a denial: 403 (default, the one nginx passes on)
//	      or 429 (Caddy, Traefik pass the answer through)
//
// An allowed request gets 200 with RateLimit and RateLimit-Policy; a
// denied one the deny status with Retry-After too. A request that names
// no rule or no key, or a bad cost, gets 400; one whose key would pass
// service.MaxKeyLen, 431.
const (
	// RuleHeader names the rule when the path does not; the path wins.
	RuleHeader = "X-Floodgate-Rule"
	// CostHeader is the request's cost, a decimal integer; default 1.
	CostHeader = "X-Floodgate-Cost"
	// MaxKeyTemplate bounds the key template, in bytes.
	MaxKeyTemplate = 256
	// DefaultKeyTemplate keys a request by its client's address.
	DefaultKeyTemplate = "{ip}"
)

// The headers each proxy writes the original request's method and URI
// into: X-Forwarded-* by Caddy and Traefik, X-Original-* by convention in
// nginx's configuration.
var (
	methodHeaders = [2]string{"X-Forwarded-Method", "X-Original-Method"}
	uriHeaders    = [2]string{"X-Forwarded-Uri", "X-Original-Uri"}
)

// keyPart is one piece of a key template: literal text, or a placeholder
// whose alternatives are tried in order.
type keyPart struct {
	literal string
	sources []keySource
}

// keySource is one alternative of a placeholder: ip, method, path, uri,
// or header (with its canonical name).
type keySource struct {
	kind   string
	header string
}

// parseKeyTemplate reads a key template: literal text with placeholders
// in braces, each one or more sources separated by "|", the first present
// giving the value:
//
//	{ip}             the client's address (IPv6: its /64), from the
//	                 trusted proxy's client address header
//	{method}         X-Forwarded-Method or X-Original-Method
//	{uri}            X-Forwarded-Uri or X-Original-URI, as sent
//	{path}           that URI's path, decoded and cleaned ("/a//b/../c/" is "/a/c")
//	{header:Name}    the request header Name
//
// e.g. "{header:X-Api-Key|ip}" or "{ip}:{method}:{path}". Braces cannot be
// literal text.
func parseKeyTemplate(tpl string) ([]keyPart, error) {
	if len(tpl) > MaxKeyTemplate {
		return nil, fmt.Errorf("the key template is %d bytes, more than the maximum %d", len(tpl), MaxKeyTemplate)
	}
	if tpl == "" {
		return nil, errors.New("the key template is empty")
	}
	var parts []keyPart
	for rest := tpl; rest != ""; {
		open := strings.IndexAny(rest, "{}")
		if open < 0 {
			parts = append(parts, keyPart{literal: rest})
			break
		}
		if rest[open] == '}' {
			return nil, fmt.Errorf("the key template %q has a } that closes no {", tpl)
		}
		if open > 0 {
			parts = append(parts, keyPart{literal: rest[:open]})
		}
		end := strings.IndexAny(rest[open+1:], "{}")
		if end < 0 || rest[open+1+end] != '}' {
			return nil, fmt.Errorf("the key template %q has a { that no } closes", tpl)
		}
		var p keyPart
		for _, alt := range strings.Split(rest[open+1:open+1+end], "|") {
			src, err := parseKeySource(alt)
			if err != nil {
				return nil, fmt.Errorf("the key template %q: %w", tpl, err)
			}
			p.sources = append(p.sources, src)
		}
		parts = append(parts, p)
		rest = rest[open+2+end:]
	}
	return parts, nil
}

func parseKeySource(s string) (keySource, error) {
	switch s {
	case "ip", "method", "uri", "path":
		return keySource{kind: s}, nil
	}
	if name, ok := strings.CutPrefix(s, "header:"); ok && validHeaderName(name) {
		return keySource{kind: "header", header: http.CanonicalHeaderKey(name)}, nil
	}
	return keySource{}, fmt.Errorf("unknown placeholder {%s}: use ip, method, uri, path or header:<Name>", s)
}

// validHeaderName reports whether s is an HTTP token (RFC 9110 5.6.2).
func validHeaderName(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0) {
			return false
		}
	}
	return true
}

// errNoSource is a placeholder none of whose sources the request has.
var errNoSource = errors.New("no key source")

// errKeyTooLong is a key longer than service.MaxKeyLen.
var errKeyTooLong = errors.New("key too long")

// single returns the one value of header name, "" when it is absent, and
// an error when the request has more than one: which one a proxy or the
// application reads is not ours to guess.
func single(r *http.Request, name string) (string, error) {
	vs := r.Header.Values(name)
	switch len(vs) {
	case 0:
		return "", nil
	case 1:
		return vs[0], nil
	}
	return "", fmt.Errorf("the request has %d %s headers; it must have at most one", len(vs), name)
}

// either returns the value of whichever of two headers the request has;
// both, with different values, is an error: one was forged by the client
// and floodgate cannot tell which.
func either(r *http.Request, names [2]string) (string, error) {
	a, err := single(r, names[0])
	if err != nil {
		return "", err
	}
	b, err := single(r, names[1])
	if err != nil {
		return "", err
	}
	if a != "" && b != "" && a != b {
		return "", fmt.Errorf("the request has both %s and %s, which differ", names[0], names[1])
	}
	if a == "" {
		return b, nil
	}
	return a, nil
}

// sourceValue returns what src gives for r, "" when r lacks it.
func (a *api) sourceValue(r *http.Request, src keySource) (string, error) {
	switch src.kind {
	case "ip":
		return a.clientIP(r)
	case "method":
		return either(r, methodHeaders)
	case "header":
		return single(r, src.header)
	}
	uri, err := either(r, uriHeaders)
	if err != nil || uri == "" || src.kind == "uri" {
		return uri, err
	}
	u, err := url.ParseRequestURI(uri)
	if err != nil {
		return "", fmt.Errorf("the original URI %q is not a request URI", uri)
	}
	p := u.Path
	if p == "" {
		p = "/"
	}
	return path.Clean(p), nil
}

// clientIP returns the client's address, as the trusted proxy that calls
// reports it. A caller that is not a trusted proxy, or one that sends no
// address, is an error: the caller's own address is the proxy's, which
// would put every client on one key.
func (a *api) clientIP(r *http.Request) (string, error) {
	if a.ipErr != nil {
		return "", a.ipErr
	}
	if len(a.o.TrustedProxies) == 0 {
		return "", errors.New("{ip} needs the proxies' addresses: start floodgate serve with --trusted-proxies")
	}
	peer, err := clientip.ParseHost(r.RemoteAddr)
	if err != nil {
		return "", errors.New("the caller's address is unknown")
	}
	if !trusted(a.o.TrustedProxies, peer) {
		return "", fmt.Errorf("the caller %s is not one of --trusted-proxies, so its %s cannot be believed", peer, a.ip.Header())
	}
	vals := r.Header.Values(a.ip.Header())
	if len(vals) == 0 {
		return "", nil
	}
	k := clientip.Key(a.ip.Client(peer, vals))
	return strings.TrimPrefix(k, "ip:"), nil
}

func trusted(ps []netip.Prefix, a netip.Addr) bool {
	for _, p := range ps {
		if p.Contains(a) {
			return true
		}
	}
	return false
}

// expandKey fills the template in from r, stopping at service.MaxKeyLen.
func (a *api) expandKey(r *http.Request, parts []keyPart) (string, error) {
	var b strings.Builder
	for _, p := range parts {
		v := p.literal
		if p.sources != nil {
			var names []string
			for _, src := range p.sources {
				got, err := a.sourceValue(r, src)
				if err != nil {
					return "", err
				}
				if got != "" {
					v = got
					break
				}
				names = append(names, sourceName(src))
			}
			if v == "" {
				return "", fmt.Errorf("%w: the request has none of %s", errNoSource, strings.Join(names, ", "))
			}
		}
		if b.Len()+len(v) > service.MaxKeyLen {
			return "", fmt.Errorf("%w: the key would be more than %d bytes", errKeyTooLong, service.MaxKeyLen)
		}
		b.WriteString(v)
	}
	return b.String(), nil
}

func sourceName(src keySource) string {
	switch src.kind {
	case "ip":
		return "the client address header"
	case "method":
		return strings.Join(methodHeaders[:], " or ")
	case "header":
		return src.header
	}
	return strings.Join(uriHeaders[:], " or ")
}

// denyStatus reads the deny parameter.
func denyStatus(s string) (int, error) {
	switch s {
	case "", "403":
		return http.StatusForbidden, nil
	case "429":
		return http.StatusTooManyRequests, nil
	}
	// Not 401: it would need a WWW-Authenticate challenge, and nginx
	// passes none of the other headers with it.
	return 0, fmt.Errorf("deny must be 403 or 429, got %q", s)
}

// parseCost reads the cost header: decimal digits, at most 18 of them.
func parseCost(s string) (int64, error) {
	if s == "" || len(s) > 18 {
		return 0, fmt.Errorf("%s must be a whole number from 0 to 10^18, got %q", CostHeader, s)
	}
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return 0, fmt.Errorf("%s must be a whole number from 0 to 10^18, got %q", CostHeader, s)
		}
	}
	return strconv.ParseInt(s, 10, 64)
}

// forwardAuth answers a proxy's question about one request.
func (a *api) forwardAuth(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Cache-Control", "no-store")
	q := r.URL.Query()
	for k := range q {
		if k != "key" && k != "deny" {
			problem(w, http.StatusBadRequest, fmt.Sprintf("unknown parameter %q: the forward auth endpoint takes key and deny", k))
			return
		}
		if len(q[k]) > 1 {
			problem(w, http.StatusBadRequest, fmt.Sprintf("parameter %q is given %d times", k, len(q[k])))
			return
		}
	}
	deny, err := denyStatus(q.Get("deny"))
	if err != nil {
		problem(w, http.StatusBadRequest, err.Error())
		return
	}
	rule := r.PathValue("rule")
	if rule == "" {
		if rule, err = single(r, RuleHeader); err != nil {
			problem(w, http.StatusBadRequest, err.Error())
			return
		}
		if rule == "" {
			problem(w, http.StatusBadRequest, "no rule: name it in the path, /v1/auth/<rule>, or in "+RuleHeader)
			return
		}
	}
	tpl := DefaultKeyTemplate
	if q.Has("key") {
		tpl = q.Get("key")
	}
	parts, err := parseKeyTemplate(tpl)
	if err != nil {
		problem(w, http.StatusBadRequest, err.Error())
		return
	}
	key, err := a.expandKey(r, parts)
	if err != nil {
		status := http.StatusBadRequest
		if errors.Is(err, errKeyTooLong) {
			status = http.StatusRequestHeaderFieldsTooLarge
		}
		problem(w, status, err.Error())
		return
	}
	cost := int64(1)
	switch vs := r.Header.Values(CostHeader); len(vs) {
	case 0:
	case 1:
		if cost, err = parseCost(vs[0]); err != nil {
			problem(w, http.StatusBadRequest, err.Error())
			return
		}
	default:
		problem(w, http.StatusBadRequest, fmt.Sprintf("the request has %d %s headers; it must have at most one", len(vs), CostHeader))
		return
	}
	d, err := a.svc.Check(r.Context(), rule, key, cost)
	if err != nil {
		status := statusOf(err)
		if status >= 500 && !errors.Is(err, floodgate.ErrKey) {
			a.o.Logger.Error("floodgate: forward auth check failed", "rule", rule, "error", err.Error())
		}
		problem(w, status, err.Error())
		return
	}
	h := w.Header()
	h.Set("RateLimit-Policy", headers.Policy(d.Limits))
	h.Set("RateLimit", headers.RateLimit(d.Result, len(d.Limits)))
	if d.Allowed {
		writeJSON(w, http.StatusOK, NewCheckResponse(d))
		return
	}
	policy := headers.Name(d.Result.Name, d.Result.Index, len(d.Limits))
	detail := fmt.Sprintf("the request's cost %d is more than policy %q admits at once; it can never be allowed", cost, policy)
	if d.Result.RetryAfter != floodgate.Never {
		s := headers.Seconds(d.Result.RetryAfter)
		h.Set("Retry-After", strconv.FormatInt(s, 10))
		detail = fmt.Sprintf("rate limit policy %q exceeded; retry in %d s", policy, s)
	}
	problem(w, deny, detail)
}
