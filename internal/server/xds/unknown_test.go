package xds

import (
	"testing"

	rlsconf "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
)

// TestUnknownFields: a resource with fields this version of
// RateLimitConfig lacks (a newer server's, at any depth) is converted
// without them, as envoyproxy/ratelimit converts it, and named so that
// the client can warn.
func TestUnknownFields(t *testing.T) {
	for _, tc := range []struct {
		name    string
		mutate  func(rc *rlsconf.RateLimitConfig)
		unknown bool
	}{
		{"none", func(*rlsconf.RateLimitConfig) {}, false},
		{"top level", func(rc *rlsconf.RateLimitConfig) { addUnknown(rc) }, true},
		{"descriptor", func(rc *rlsconf.RateLimitConfig) { addUnknown(rc.Descriptors[0]) }, true},
		{"nested descriptor", func(rc *rlsconf.RateLimitConfig) { addUnknown(rc.Descriptors[1].Descriptors[0]) }, true},
		{"rate limit", func(rc *rlsconf.RateLimitConfig) { addUnknown(rc.Descriptors[0].RateLimit) }, true},
		{"replaces", func(rc *rlsconf.RateLimitConfig) { addUnknown(rc.Descriptors[0].RateLimit.Replaces[0]) }, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rc := &rlsconf.RateLimitConfig{Name: "r", Domain: "d", Descriptors: []*rlsconf.RateLimitDescriptor{
				{Key: "a", RateLimit: &rlsconf.RateLimitPolicy{Unit: rlsconf.RateLimitUnit_SECOND, RequestsPerUnit: 1, Name: "x", Replaces: []*rlsconf.RateLimitReplace{{Name: "y"}}}},
				{Key: "b", Descriptors: []*rlsconf.RateLimitDescriptor{{Key: "c"}}},
			}}
			tc.mutate(rc)
			a, err := anypb.New(rc)
			if err != nil {
				t.Fatal(err)
			}
			cfg, unknown, err := convert([]*anypb.Any{a}, false)
			if err != nil {
				t.Fatal(err)
			}
			if cfg.Domains["d"] == nil || (len(unknown) > 0) != tc.unknown {
				t.Fatalf("domains %v, unknown %v; want unknown %v", cfg.Domains, unknown, tc.unknown)
			}
			if tc.unknown && unknown[0] != `xDS resource "r"` {
				t.Fatalf("unknown %v", unknown)
			}
		})
	}
}

// addUnknown gives m a field numbered 99, which no version has.
func addUnknown(m proto.Message) {
	r := m.ProtoReflect()
	b := protowire.AppendTag(nil, 99, protowire.VarintType)
	r.SetUnknown(append(r.GetUnknown(), protowire.AppendVarint(b, 1)...))
}
