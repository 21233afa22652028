package xds_test

import (
	"errors"
	"strings"
	"testing"

	rlsconf "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/floodgate/floodgate/internal/server/config"
	"github.com/floodgate/floodgate/internal/server/xds"
)

func anyOf(t testing.TB, m proto.Message) *anypb.Any {
	t.Helper()
	a, err := anypb.New(m)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

func entry(k, v string) config.Entry { return config.Entry{Key: k, Value: v} }

func policy(u rlsconf.RateLimitUnit, rpu uint32) *rlsconf.RateLimitPolicy {
	return &rlsconf.RateLimitPolicy{Unit: u, RequestsPerUnit: rpu}
}

// TestConvert reads a resource with every field of RateLimitConfig and
// checks the domain it makes.
func TestConvert(t *testing.T) {
	rc := &rlsconf.RateLimitConfig{Name: "r", Domain: "api", Descriptors: []*rlsconf.RateLimitDescriptor{
		{Key: "remote_address", RateLimit: policy(rlsconf.RateLimitUnit_SECOND, 10)},
		{Key: "path", Value: "/api/*", ShadowMode: true, DetailedMetric: true, RateLimit: policy(rlsconf.RateLimitUnit_HOUR, 100)},
		{Key: "tier", Value: "low", RateLimit: &rlsconf.RateLimitPolicy{Unit: rlsconf.RateLimitUnit_DAY, RequestsPerUnit: 2, Name: "low"}},
		{Key: "tier", Value: "high", RateLimit: &rlsconf.RateLimitPolicy{Unit: 7, RequestsPerUnit: 9, Replaces: []*rlsconf.RateLimitReplace{{Name: "low"}}}},
		{Key: "free", RateLimit: &rlsconf.RateLimitPolicy{Unlimited: true}},
		{Key: "blocked", RateLimit: policy(rlsconf.RateLimitUnit_MINUTE, 0)},
		{Key: "month", RateLimit: policy(5, 3)},
		{Key: "year", RateLimit: policy(6, 3)},
		{Key: "message_type", Value: "marketing", Descriptors: []*rlsconf.RateLimitDescriptor{
			{Key: "to_number", RateLimit: policy(rlsconf.RateLimitUnit_DAY, 5)},
		}},
	}}
	cfg, err := xds.Convert([]*anypb.Any{anyOf(t, rc)}, false)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Source != xds.Source || len(cfg.Rules) != 0 || len(cfg.Domains) != 1 {
		t.Fatalf("config %+v", cfg)
	}
	d := cfg.Domains["api"]
	if d == nil || d.File != `xDS resource "r"` {
		t.Fatalf("domain %+v", d)
	}
	for _, tc := range []struct {
		entries []config.Entry
		rpu     uint32
		unit    config.Unit
		check   func(config.Match) bool
	}{
		{[]config.Entry{entry("remote_address", "1.2.3.4")}, 10, config.UnitSecond, nil},
		{[]config.Entry{entry("path", "/api/x")}, 100, config.UnitHour, func(m config.Match) bool { return m.Node.ShadowMode && m.Node.DetailedMetric }},
		{[]config.Entry{entry("tier", "low")}, 2, config.UnitDay, func(m config.Match) bool { return m.Limit.Name == "low" }},
		{[]config.Entry{entry("tier", "high")}, 9, config.UnitWeek, func(m config.Match) bool { return len(m.Limit.Replaces) == 1 && m.Limit.Replaces[0] == "low" }},
		{[]config.Entry{entry("free", "x")}, 0, config.UnitUnknown, func(m config.Match) bool { return m.Limit.Unlimited }},
		{[]config.Entry{entry("blocked", "x")}, 0, config.UnitMinute, nil},
		{[]config.Entry{entry("month", "x")}, 3, config.UnitMonth, nil},
		{[]config.Entry{entry("year", "x")}, 3, config.UnitYear, nil},
		{[]config.Entry{entry("message_type", "marketing"), entry("to_number", "1")}, 5, config.UnitDay, nil},
	} {
		m := d.Lookup(tc.entries)
		if m.Limit == nil || m.Limit.RequestsPerUnit != tc.rpu || m.Limit.Unit != tc.unit || (tc.check != nil && !tc.check(m)) {
			t.Errorf("%v: %+v", tc.entries, m.Limit)
		}
	}
	if m := d.Lookup([]config.Entry{entry("message_type", "marketing")}); m.Limit != nil {
		t.Errorf("message_type alone has a limit: %+v", m.Limit)
	}

	// No resources: no domains, as an empty snapshot says.
	if cfg, err := xds.Convert(nil, false); err != nil || len(cfg.Domains) != 0 {
		t.Fatalf("no resources: %v, %v", cfg, err)
	}
}

// TestConvertRefuses gives Convert what a server may send wrong: each
// is an error that names the resource and the problem, never a panic.
func TestConvertRefuses(t *testing.T) {
	good := func() *rlsconf.RateLimitConfig {
		return &rlsconf.RateLimitConfig{Name: "r", Domain: "api", Descriptors: []*rlsconf.RateLimitDescriptor{
			{Key: "remote_address", RateLimit: policy(rlsconf.RateLimitUnit_SECOND, 10)},
		}}
	}
	with := func(f func(*rlsconf.RateLimitConfig)) []*anypb.Any {
		rc := good()
		f(rc)
		return []*anypb.Any{anyOf(t, rc)}
	}
	deep := func(n int) []*rlsconf.RateLimitDescriptor {
		var ds []*rlsconf.RateLimitDescriptor
		for range n {
			ds = []*rlsconf.RateLimitDescriptor{{Key: "k", Descriptors: ds}}
		}
		return ds
	}
	// wide is a RateLimitConfig of domain "api" and n descriptors {key:
	// k}, encoded by hand: proto.Marshal takes seconds under -race.
	wide := func(n int) []*anypb.Any {
		b := []byte{0x12, 3, 'a', 'p', 'i'}
		for range n {
			b = append(b, 0x1a, 3, 0x0a, 1, 'k')
		}
		return []*anypb.Any{{TypeUrl: xds.TypeURL, Value: b}}
	}
	// nested is one descriptor {key: a} with n descriptors {key: k} below.
	nested := func(n int) []*anypb.Any {
		inner := []byte{0x0a, 1, 'a'}
		for range n {
			inner = append(inner, 0x22, 3, 0x0a, 1, 'k')
		}
		b := []byte{0x12, 3, 'a', 'p', 'i', 0x1a}
		b = protowire.AppendVarint(b, uint64(len(inner)))
		return []*anypb.Any{{TypeUrl: xds.TypeURL, Value: append(b, inner...)}}
	}
	for _, tc := range []struct {
		name      string
		resources []*anypb.Any
		merge     bool
		want      string
		resource  bool // wraps ErrResource
	}{
		{"nil resource", []*anypb.Any{nil}, false, "xDS resource 0 is empty", true},
		{"another type", []*anypb.Any{anyOf(t, durationpb.New(1))}, false, `xDS resource 0 has type "type.googleapis.com/google.protobuf.Duration"`, true},
		{"garbage", []*anypb.Any{{TypeUrl: xds.TypeURL, Value: []byte{0xff, 0xff, 0xff}}}, false, "xDS resource 0 does not decode as a RateLimitConfig", true},
		{"bad utf-8", []*anypb.Any{{TypeUrl: xds.TypeURL, Value: []byte{0x12, 2, 0xc3, 0x28}}}, false, "does not decode", true},
		{"empty domain", with(func(rc *rlsconf.RateLimitConfig) { rc.Domain = "" }), false, `xDS resource "r": domain: config file cannot have empty domain`, false},
		{"empty key", with(func(rc *rlsconf.RateLimitConfig) { rc.Descriptors[0].Key = "" }), false, `xDS resource "r": descriptors[0].key: descriptor has empty key`, false},
		{"no unit", with(func(rc *rlsconf.RateLimitConfig) { rc.Descriptors[0].RateLimit.Unit = 0 }), false, `descriptors[0].rate_limit.unit: invalid rate limit unit 'UNKNOWN'`, false},
		{"unknown unit", with(func(rc *rlsconf.RateLimitConfig) { rc.Descriptors[0].RateLimit.Unit = 9 }), false, `descriptors[0].rate_limit.unit: invalid rate limit unit '9'`, false},
		{"negative unit", with(func(rc *rlsconf.RateLimitConfig) { rc.Descriptors[0].RateLimit.Unit = -1 }), false, `invalid rate limit unit '-1'`, false},
		{"unlimited with a unit", with(func(rc *rlsconf.RateLimitConfig) { rc.Descriptors[0].RateLimit.Unlimited = true }), false, `descriptors[0].rate_limit.unit: should not specify rate limit unit when unlimited`, false},
		{"duplicate descriptor", with(func(rc *rlsconf.RateLimitConfig) { rc.Descriptors = append(rc.Descriptors, rc.Descriptors[0]) }), false, `duplicate descriptor composite key 'api.remote_address'`, false},
		{"empty replaces", with(func(rc *rlsconf.RateLimitConfig) {
			rc.Descriptors[0].RateLimit.Replaces = []*rlsconf.RateLimitReplace{{}}
		}), false, "should not have an empty replaces entry", false},
		{"replaces itself", with(func(rc *rlsconf.RateLimitConfig) {
			rc.Descriptors[0].RateLimit.Name = "a"
			rc.Descriptors[0].RateLimit.Replaces = []*rlsconf.RateLimitReplace{{Name: "a"}}
		}), false, "replaces should not contain name of same descriptor", false},
		{"domain twice", []*anypb.Any{anyOf(t, good()), anyOf(t, good())}, false, "duplicate domain 'api'", false},
		{"domain twice, merged, same descriptor", []*anypb.Any{anyOf(t, good()), anyOf(t, good())}, true, "duplicate descriptor composite key 'api.remote_address'", false},
		{"too many descriptors", wide(xds.MaxDescriptors + 1), false, "more than 100000 descriptors", true},
		{"too many, nested", nested(xds.MaxDescriptors), false, "more than 100000 descriptors", true},
		{"errors of two resources", []*anypb.Any{
			anyOf(t, &rlsconf.RateLimitConfig{Name: "a", Domain: "a", Descriptors: []*rlsconf.RateLimitDescriptor{{Key: ""}}}),
			anyOf(t, &rlsconf.RateLimitConfig{Name: "b", Domain: "b", Descriptors: []*rlsconf.RateLimitDescriptor{{Key: "k", RateLimit: policy(0, 1)}}}),
		}, false, "xDS resource \"a\": descriptors[0].key: descriptor has empty key\nxDS resource \"b\": descriptors[0].rate_limit.unit", false},
		{"deep and bad at the bottom", with(func(rc *rlsconf.RateLimitConfig) {
			ds := deep(500)
			d := ds[0]
			for len(d.Descriptors) > 0 {
				d = d.Descriptors[0]
			}
			d.RateLimit = policy(12, 1)
			rc.Descriptors = ds
		}), false, "invalid rate limit unit '12'", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg, err := xds.Convert(tc.resources, tc.merge)
			if err == nil {
				t.Fatalf("converted: %+v", cfg)
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %q\nwant %q in it", err, tc.want)
			}
			if errors.Is(err, xds.ErrResource) != tc.resource {
				t.Fatalf("errors.Is(%v, ErrResource) = %v, want %v", err, !tc.resource, tc.resource)
			}
		})
	}
}

// TestConvertMerges: with merge, two resources of one domain are one
// domain, as two files are with MERGE_DOMAIN_CONFIG.
func TestConvertMerges(t *testing.T) {
	a := &rlsconf.RateLimitConfig{Name: "a", Domain: "api", Descriptors: []*rlsconf.RateLimitDescriptor{{Key: "x", RateLimit: policy(rlsconf.RateLimitUnit_SECOND, 1)}}}
	b := &rlsconf.RateLimitConfig{Name: "b", Domain: "api", Descriptors: []*rlsconf.RateLimitDescriptor{{Key: "y", RateLimit: policy(rlsconf.RateLimitUnit_SECOND, 2)}}}
	cfg, err := xds.Convert([]*anypb.Any{anyOf(t, a), anyOf(t, b)}, true)
	if err != nil {
		t.Fatal(err)
	}
	d := cfg.Domains["api"]
	for key, rpu := range map[string]uint32{"x": 1, "y": 2} {
		if m := d.Lookup([]config.Entry{entry(key, "v")}); m.Limit == nil || m.Limit.RequestsPerUnit != rpu {
			t.Errorf("%s: %+v", key, m.Limit)
		}
	}
}

// FuzzConvert feeds any bytes as a RateLimitConfig: Convert returns a
// configuration or an error, never panics.
func FuzzConvert(f *testing.F) {
	for _, rc := range []*rlsconf.RateLimitConfig{
		edge(5),
		{Domain: "d", Descriptors: []*rlsconf.RateLimitDescriptor{{Key: "k", Value: "a*b*", RateLimit: &rlsconf.RateLimitPolicy{Unlimited: true}}}},
		{Domain: "d", Descriptors: []*rlsconf.RateLimitDescriptor{{Key: "k", Descriptors: []*rlsconf.RateLimitDescriptor{{Key: "j", RateLimit: policy(9, 1)}}}}},
	} {
		b, err := proto.Marshal(rc)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		cfg, err := xds.Convert([]*anypb.Any{{TypeUrl: xds.TypeURL, Value: b}}, false)
		if (cfg == nil) == (err == nil) {
			t.Fatalf("config %v and error %v", cfg, err)
		}
	})
}
