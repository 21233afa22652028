package redisstore_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/floodgate/floodgate"
	"github.com/floodgate/floodgate/internal/testkit/redistest"
	"github.com/floodgate/floodgate/redisstore"
)

// A failed override write changes nothing: a corrupt state on either side
// of the carry fails the call before the override or any state is
// written.
func TestOverrideOnCorruptStateChangesNothing(t *testing.T) {
	srv := redistest.Start(t)
	client, admin := srv.Client(t), srv.Admin(t)
	ctx := context.Background()
	st := newStore(t, client, &redisstore.Options{Prefix: "c:"})
	lim := limiter(t, st, floodgate.PerSecond(10), floodgate.FixedWindow(100, time.Minute))
	for _, tt := range []struct {
		name, key, corrupt string
		override           []floodgate.Limit // nil: delete
	}{
		{"old state", "a", "c:{a}:1f", []floodgate.Limit{floodgate.PerSecond(20)}},
		{"new state", "b", "c:{b}:1l", []floodgate.Limit{floodgate.PerSecond(20), floodgate.SlidingLog(5, time.Minute)}},
		{"deleting", "d", "c:{d}:1f", nil},
	} {
		t.Run(tt.name, func(t *testing.T) {
			if _, err := lim.AllowN(ctx, tt.key, 3); err != nil {
				t.Fatal(err)
			}
			if tt.override == nil {
				if err := lim.SetOverride(ctx, tt.key, floodgate.Override{Limits: []floodgate.Limit{floodgate.PerSecond(50)}}, floodgate.AsIs); err != nil {
					t.Fatal(err)
				}
			}
			if err := client.Set(ctx, tt.corrupt, "garbage", 0).Err(); err != nil {
				t.Fatal(err)
			}
			before, err := admin.Keys(ctx, "c:{"+tt.key+"}*").Result()
			if err != nil {
				t.Fatal(err)
			}
			dump := func() map[string]string {
				m := map[string]string{}
				for _, k := range before {
					m[k] = client.Dump(ctx, k).Val()
				}
				return m
			}
			was := dump()
			if tt.override == nil {
				err = lim.DeleteOverride(ctx, tt.key, floodgate.Additive)
			} else {
				err = lim.SetOverride(ctx, tt.key, floodgate.Override{Limits: tt.override}, floodgate.Additive)
			}
			if !errors.Is(err, floodgate.ErrStore) {
				t.Fatalf("override over a corrupt state: %v, want ErrStore", err)
			}
			after, _ := admin.Keys(ctx, "c:{"+tt.key+"}*").Result()
			if len(after) != len(before) {
				t.Fatalf("keys before %v, after %v", before, after)
			}
			for k, v := range dump() {
				if was[k] != v {
					t.Errorf("%s changed", k)
				}
			}
		})
	}
}

// An override key whose value lacks floodgate's mark ("fg1") is not
// floodgate's: reading it is ErrStore in Go, as deciding on it is in Lua,
// never limits parsed from a foreign value.
func TestOverrideWithoutMark(t *testing.T) {
	srv := redistest.Start(t)
	client := srv.Client(t)
	ctx := context.Background()
	st := newStore(t, client, &redisstore.Options{Prefix: "m:"})
	lim := limiter(t, st, floodgate.PerSecond(10))
	if err := lim.SetOverride(ctx, "k", floodgate.Override{Limits: []floodgate.Limit{floodgate.PerSecond(20)}}, floodgate.AsIs); err != nil {
		t.Fatal(err)
	}
	raw, err := client.Get(ctx, "m:{k}:o").Result()
	if err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		name, value string
		foreign     bool
	}{
		{"as written", raw, false},
		{"without the mark", strings.TrimPrefix(raw, "fg1"), true},
		{"another mark", "fg2" + strings.TrimPrefix(raw, "fg1"), true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			if err := client.Set(ctx, "m:{k}:o", tt.value, 0).Err(); err != nil {
				t.Fatal(err)
			}
			_, _, gerr := lim.GetOverride(ctx, "k")
			_, derr := lim.Allow(ctx, "k")
			if !tt.foreign {
				if gerr != nil || derr != nil {
					t.Fatalf("GetOverride: %v, Allow: %v", gerr, derr)
				}
				return
			}
			if !errors.Is(gerr, floodgate.ErrStore) || !errors.Is(derr, floodgate.ErrStore) {
				t.Fatalf("GetOverride: %v, Allow: %v; want ErrStore from both", gerr, derr)
			}
		})
	}
}
