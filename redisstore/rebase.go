package redisstore

import (
	"context"
	"errors"
	"strings"

	"github.com/floodgate/floodgate"
	"github.com/floodgate/floodgate/core"
	"github.com/floodgate/floodgate/internal/lib/storekit"
	"github.com/redis/go-redis/v9"
)

// This file is core.Policy.Rebase on Redis. The limits recorded for a scope are
// the Redis key <prefix>{<scope>}:rebase, written with SET ... GET so that
// of several processes rebasing a scope to the same limits, exactly one
// finds the old limits and carries the keys; a SET whose reply was lost
// is an error, not sent again. It finds them with SCAN on every master
// and carries each with one decide.lua item, as SetOverride does, so a
// key is carried atomically with respect to its decisions.

// rebaseKey returns the Redis key that records scope's limits.
func (s *Store) rebaseKey(scope string) string {
	if strings.ContainsAny(scope, "{}") {
		return s.prefix + hashTag(scope) + scope + ":rebase"
	}
	return s.prefix + "{" + scope + "}:rebase"
}

// Rebase implements core.Policy.Rebase.
func (p *policy) Rebase(ctx context.Context, scope string, st core.Strategy) (int, error) {
	if err := storekit.CheckRebase(scope, st); err != nil {
		return 0, err
	}
	s := p.s
	if s.closed.Load() {
		return 0, floodgate.ErrClosed
	}
	for i := range p.specs {
		if p.specs[i].Calendar != 0 {
			// Calendar windows keep their count; encodeOverride cannot
			// write them, so the scope's record goes.
			if err := s.client.Del(ctx, s.rebaseKey(scope)).Err(); err != nil {
				return 0, s.wrap(ctx, err)
			}
			return 0, nil
		}
	}
	// Sent once (see onceCmd): a second SET ... GET after a lost reply
	// would read these limits as the old ones, and carry nothing.
	record := func() *redis.Cmd {
		cmd := redis.NewCmd(ctx, "set", s.rebaseKey(scope), encodeOverride(p.specs), "get")
		cmd.SetFirstKeyPos(1) // a Cluster's routing, without COMMAND
		_ = s.client.Process(ctx, onceCmd{cmd})
		return cmd
	}
	old, err := s.untilRun(ctx, record(), record).Text()
	if errors.Is(err, redis.Nil) {
		return 0, nil // the first record
	}
	if err != nil {
		return 0, s.wrap(ctx, err)
	}
	from, err := s.decoded.decode(old)
	if err != nil {
		return 0, err
	}
	if !storekit.Rebasable(from, p.specs) {
		return 0, nil
	}
	raw := "<" + encodeOverride(from)
	carried := 0
	seen := make(map[string]bool)
	scan := func(ctx context.Context, c redis.Cmdable) error {
		for _, pattern := range s.scopePatterns(scope) {
			iter := c.Scan(ctx, 0, pattern, 500).Iterator()
			for iter.Next(ctx) {
				key, ok := s.keyOfState(iter.Val())
				if !ok || seen[key] || !strings.HasPrefix(key, scope) {
					continue
				}
				seen[key] = true
				n, err := p.carryFrom(ctx, key, raw, st)
				if err != nil {
					return err
				}
				carried += n
			}
			if err := iter.Err(); err != nil {
				return err
			}
		}
		return nil
	}
	err = s.forEachServer(ctx, scan)
	if err != nil && !errors.Is(err, floodgate.ErrStore) {
		err = s.wrap(ctx, err)
	}
	return carried, err
}

// overriddenReply is decide.lua's answer to a rebase of a key that has an
// override, which it leaves alone.
const overriddenReply = errorPrefix + "overridden"

// carryFrom carries key from the limits raw ("<" and their encoding) to
// p's, in one script call; it returns 1, or 0 for a key with an override.
func (p *policy) carryFrom(ctx context.Context, key, raw string, st core.Strategy) (int, error) {
	msg, err := p.runCarry(ctx, key, p.keys(key), st, raw, 0)
	switch {
	case err != nil:
		return 0, err
	case msg == overriddenReply:
		return 0, nil
	case msg != "":
		return 0, errors.New(msg)
	}
	return 1, nil
}

// scopePatterns returns the SCAN patterns of the state keys of the keys
// that start with scope: "{scope*", and "{hash}scope*" for keys with
// braces (see keys).
func (s *Store) scopePatterns(scope string) []string {
	pre := escapeGlob(s.prefix)
	if strings.ContainsAny(scope, "{}") {
		return []string{pre + "{*}" + escapeGlob(scope) + "*"}
	}
	return []string{pre + "{" + escapeGlob(scope) + "*", pre + "{*}" + escapeGlob(scope) + "*"}
}

// keyOfState returns the key whose limit state is the Redis key rk
// (<prefix>{key}:<index><kind>, or <prefix>{hash}key:<index><kind>), and
// false for a Redis key that is not one.
func (s *Store) keyOfState(rk string) (string, bool) {
	rest, ok := strings.CutPrefix(rk, s.prefix)
	if !ok || !strings.HasPrefix(rest, "{") {
		return "", false
	}
	i := strings.LastIndexByte(rest, ':')
	if i < 0 || !isStateSuffix(rest[i+1:]) {
		return "", false
	}
	rest = rest[:i]
	if strings.HasSuffix(rest, "}") && !strings.ContainsAny(rest[1:len(rest)-1], "{}") {
		key := rest[1 : len(rest)-1]
		return key, key != ""
	}
	j := strings.IndexByte(rest, '}')
	key := rest[j+1:]
	return key, strings.ContainsAny(key, "{}") && hashTag(key) == rest[:j+1]
}

// isStateSuffix reports whether suffix is a limit state's: its index and
// its kind's letter (see suffixOf).
func isStateSuffix(suffix string) bool {
	if len(suffix) < 2 || !strings.ContainsRune("bfsl", rune(suffix[len(suffix)-1])) {
		return false
	}
	for _, c := range suffix[:len(suffix)-1] {
		if c < '0' || c > '9' {
			return false
		}
	}
	return true
}
