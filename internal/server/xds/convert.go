package xds

import (
	"errors"
	"fmt"
	"strconv"
	"strings"

	rlsconf "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"
	"go.yaml.in/yaml/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/floodgate/floodgate/internal/server/config"
)

// TypeURL is the type of the resources the client subscribes to:
// envoyproxy/ratelimit's RateLimitConfig, one domain each.
const TypeURL = "type.googleapis.com/ratelimit.config.ratelimit.v3.RateLimitConfig"

// Source is the config.Config Source of a configuration from xDS, and
// the start of what its errors name.
const Source = "xDS"

// MaxDescriptors bounds the descriptors of one response, over all its
// resources: each becomes a few YAML nodes before it is validated, and a
// message of a few MiB could otherwise hold millions of empty ones.
const MaxDescriptors = 100_000

// ErrResource is wrapped by the errors of resources that are not
// RateLimitConfigs.
var ErrResource = errors.New("xds: bad resource")

// Convert reads the resources of one state-of-the-world response, each a
// RateLimitConfig, as one configuration of envoyproxy/ratelimit domains:
// each is validated as a domain file is (package config), and a domain
// given by two resources is an error unless merge (MERGE_DOMAIN_CONFIG),
// as among files. No resources is a configuration without domains. A
// resource of another type, one that does not decode, and one that the
// domain format refuses are errors that name the resource; Convert never
// panics on what a server sends.
func Convert(resources []*anypb.Any, merge bool) (*config.Config, error) {
	cfg, _, err := convert(resources, merge)
	return cfg, err
}

// convert is Convert, which also returns the names of the resources that
// had fields this version's RateLimitConfig lacks (ignored, as
// envoyproxy/ratelimit ignores them).
func convert(resources []*anypb.Any, merge bool) (*config.Config, []string, error) {
	var (
		domains []*config.Domain
		errs    config.Errors
		unknown []string
		count   int
	)
	for i, res := range resources {
		name := fmt.Sprintf("%s resource %d", Source, i)
		if res == nil {
			return nil, nil, fmt.Errorf("%w: %s is empty", ErrResource, name)
		}
		if res.GetTypeUrl() != TypeURL {
			return nil, nil, fmt.Errorf("%w: %s has type %q, not %s", ErrResource, name, res.GetTypeUrl(), TypeURL)
		}
		rc := &rlsconf.RateLimitConfig{}
		if err := anypb.UnmarshalTo(res, rc, proto.UnmarshalOptions{}); err != nil {
			return nil, nil, fmt.Errorf("%w: %s does not decode as a RateLimitConfig: %v", ErrResource, name, err)
		}
		if rc.GetName() != "" {
			name = fmt.Sprintf("%s resource %q", Source, rc.GetName())
		}
		if count += countDescriptors(rc.GetDescriptors(), MaxDescriptors-count+1); count > MaxDescriptors {
			return nil, nil, fmt.Errorf("%w: the resources have more than %d descriptors", ErrResource, MaxDescriptors)
		}
		if hasUnknown(rc) {
			unknown = append(unknown, name)
		}
		d, err := config.ParseEnvoyNode(name, domainNode(rc))
		if err != nil {
			var es config.Errors
			if !errors.As(err, &es) {
				return nil, nil, err
			}
			errs = append(errs, es...)
			continue
		}
		domains = append(domains, d)
	}
	if len(errs) > 0 {
		return nil, nil, errs
	}
	cfg, err := config.FromDomains(Source, domains, merge)
	if err != nil {
		return nil, nil, err
	}
	return cfg, unknown, nil
}

// countDescriptors counts ds and the descriptors below them, stopping
// once past limit.
func countDescriptors(ds []*rlsconf.RateLimitDescriptor, limit int) int {
	n := 0
	for _, d := range ds {
		if n++; n > limit {
			return n
		}
		n += countDescriptors(d.GetDescriptors(), limit-n)
		if n > limit {
			return n
		}
	}
	return n
}

// hasUnknown reports whether rc or any message in it has fields that
// this version of the type does not know (a newer server's).
func hasUnknown(rc *rlsconf.RateLimitConfig) bool {
	if len(rc.ProtoReflect().GetUnknown()) > 0 {
		return true
	}
	var walk func(ds []*rlsconf.RateLimitDescriptor) bool
	walk = func(ds []*rlsconf.RateLimitDescriptor) bool {
		for _, d := range ds {
			if len(d.ProtoReflect().GetUnknown()) > 0 {
				return true
			}
			if rl := d.GetRateLimit(); rl != nil {
				if len(rl.ProtoReflect().GetUnknown()) > 0 {
					return true
				}
				for _, r := range rl.GetReplaces() {
					if len(r.ProtoReflect().GetUnknown()) > 0 {
						return true
					}
				}
			}
			if walk(d.GetDescriptors()) {
				return true
			}
		}
		return false
	}
	return walk(rc.GetDescriptors())
}

// domainNode is rc as the YAML of a domain file, which config parses and
// validates; envoyproxy/ratelimit likewise turns a RateLimitConfig into
// its file format before loading it.
func domainNode(rc *rlsconf.RateLimitConfig) *yaml.Node {
	root := mapping()
	add(root, "domain", str(rc.GetDomain()))
	if ds := rc.GetDescriptors(); len(ds) > 0 {
		add(root, "descriptors", descriptorsNode(ds))
	}
	return root
}

func descriptorsNode(ds []*rlsconf.RateLimitDescriptor) *yaml.Node {
	list := &yaml.Node{Kind: yaml.SequenceNode, Tag: "!!seq"}
	for _, d := range ds {
		n := mapping()
		add(n, "key", str(d.GetKey()))
		if d.GetValue() != "" {
			add(n, "value", str(d.GetValue()))
		}
		if rl := d.GetRateLimit(); rl != nil {
			add(n, "rate_limit", rateLimitNode(rl))
		}
		if sub := d.GetDescriptors(); len(sub) > 0 {
			add(n, "descriptors", descriptorsNode(sub))
		}
		if d.GetShadowMode() {
			add(n, "shadow_mode", boolean(true))
		}
		if d.GetDetailedMetric() {
			add(n, "detailed_metric", boolean(true))
		}
		list.Content = append(list.Content, n)
	}
	return list
}

func rateLimitNode(rl *rlsconf.RateLimitPolicy) *yaml.Node {
	n := mapping()
	add(n, "requests_per_unit", &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!int", Value: strconv.FormatUint(uint64(rl.GetRequestsPerUnit()), 10)})
	// The enum's numbers are the RLS API's, and config.Unit's: an unknown
	// one stays a number, which the parser refuses by name. UNKNOWN (0)
	// is no unit, which an unlimited limit must have.
	switch u := int32(rl.GetUnit()); {
	case u == 0 && rl.GetUnlimited():
	case u == 0:
		add(n, "unit", str("UNKNOWN"))
	case config.Unit(u).Seconds() > 0:
		add(n, "unit", str(strings.ToLower(config.Unit(u).String())))
	default:
		add(n, "unit", str(strconv.Itoa(int(u))))
	}
	if rl.GetUnlimited() {
		add(n, "unlimited", boolean(true))
	}
	if rl.GetName() != "" {
		add(n, "name", str(rl.GetName()))
	}
	if rs := rl.GetReplaces(); len(rs) > 0 {
		list := &yaml.Node{Kind: yaml.SequenceNode, Tag: "!!seq"}
		for _, r := range rs {
			m := mapping()
			add(m, "name", str(r.GetName()))
			list.Content = append(list.Content, m)
		}
		add(n, "replaces", list)
	}
	return n
}

func mapping() *yaml.Node { return &yaml.Node{Kind: yaml.MappingNode, Tag: "!!map"} }

func str(s string) *yaml.Node { return &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!str", Value: s} }

func boolean(b bool) *yaml.Node {
	return &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!bool", Value: strconv.FormatBool(b)}
}

func add(m *yaml.Node, key string, v *yaml.Node) {
	m.Content = append(m.Content, str(key), v)
}
