package redisstore_test

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/floodgate/floodgate"
	"github.com/floodgate/floodgate/internal/testkit/redistest"
	"github.com/floodgate/floodgate/redisstore"
)

// TestACLRules runs the store as a user with exactly ACLRules for the
// default prefix, logged in by a redis://user:pass@ URL: decisions on
// every algorithm, the denial cache and leases with their lifts, an
// override, a listing and a rebase, a refund and a reset, with functions
// and with scripts. None may be refused.
func TestACLRules(t *testing.T) {
	srv := redistest.Start(t)
	ctx := context.Background()
	args := []any{"ACL", "SETUSER", "limiter", "on", ">pw"}
	for _, r := range strings.Fields(redisstore.ACLRules("")) {
		args = append(args, r)
	}
	if err := srv.Admin(t).Do(ctx, args...).Err(); err != nil {
		t.Fatalf("ACL SETUSER %s: %v", redisstore.ACLRules(""), err)
	}
	limits := []floodgate.Limit{floodgate.TokenBucket(2, time.Hour, 2), floodgate.FixedWindow(2, time.Hour),
		floodgate.SlidingWindow(2, time.Hour), floodgate.SlidingLog(2, time.Hour)}
	for _, tt := range []struct {
		name string
		opts redisstore.Options
	}{
		{"functions", redisstore.Options{DenialCache: true, Leases: &redisstore.LeaseOptions{}}},
		{"scripts", redisstore.Options{DenialCache: true, DisableFunctions: true}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			a, err := redisstore.NewFromURL("redis://limiter:pw@"+srv.Addr+"/0", &tt.opts)
			if err != nil {
				t.Fatal(err)
			}
			defer a.Close()
			b, err := redisstore.NewFromURL("redis://limiter:pw@"+srv.Addr+"/0", &tt.opts)
			if err != nil {
				t.Fatal(err)
			}
			defer b.Close()
			for _, l := range limits {
				la, lb := limiter(t, a, l), limiter(t, b, l)
				key := tt.name + l.String()
				for i := 0; i < 4; i++ { // two admitted, then denials (cached)
					if _, err := la.Allow(ctx, key); err != nil {
						t.Fatalf("%s: Allow: %v", l, err)
					}
				}
				steps := []struct {
					name string
					do   func() error
				}{
					{"Refund", func() error { _, err := lb.Refund(ctx, key, 1); return err }},
					{"SetOverride", func() error {
						return lb.SetOverride(ctx, key, floodgate.Override{Limits: []floodgate.Limit{l}}, floodgate.Additive)
					}},
					{"GetOverride", func() error { _, _, err := lb.GetOverride(ctx, key); return err }},
					{"ListOverrides", func() error {
						return lb.ListOverrides(ctx, func(string, floodgate.Override) bool { return true })
					}},
					{"Rebase", func() error { _, err := lb.Rebase(ctx, tt.name, floodgate.Additive); return err }},
					{"DeleteOverride", func() error { return lb.DeleteOverride(ctx, key, floodgate.Additive) }},
					{"Reset", func() error { return lb.Reset(ctx, key) }},
					{"Allow", func() error { _, err := la.Allow(ctx, key); return err }},
				}
				for _, st := range steps {
					if err := st.do(); err != nil {
						t.Fatalf("%s: %s: %v", l, st.name, err)
					}
				}
			}
		})
	}
	// Nothing went to EVALSHA for want of a permission: functions ran.
	if info := srv.Admin(t).Info(ctx, "commandstats").Val(); !strings.Contains(info, "cmdstat_fcall:") {
		t.Errorf("no FCALL ran under the ACL:\n%s", info)
	}
	// go-redis's CLIENT SETINFO (Redis 7.2, Valkey) is the one refusal
	// allowed: go-redis ignores it, and Redis 7.0 has no such command for
	// the rules to name.
	entries, err := srv.Admin(t).Do(ctx, "ACL", "LOG").Slice()
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if m, ok := e.(map[any]any); !ok || m["object"] != "client|setinfo" {
			t.Errorf("the ACL refused something: %v", e)
		}
	}
}

// TestACLRulesDocumented: docs/redis.md quotes ACLRules for the default
// prefix word for word, so the documented ACL is the one CI runs under.
func TestACLRulesDocumented(t *testing.T) {
	doc, err := os.ReadFile("../docs/redis.md")
	if err != nil {
		t.Fatal(err)
	}
	if want := redisstore.ACLRules(""); !strings.Contains(string(doc), want) {
		t.Errorf("docs/redis.md's ACL section does not quote redisstore.ACLRules(\"\"):\n%s", want)
	}
}
