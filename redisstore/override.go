package redisstore

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/floodgate/floodgate"
	"github.com/floodgate/floodgate/core"
	"github.com/floodgate/floodgate/internal/lib/arith"
	"github.com/floodgate/floodgate/internal/lib/storekit"
	"github.com/redis/go-redis/v9"
)

// This file keeps per-key overrides in Redis, so that every process sees
// them. A key's override is the Redis key <prefix>{<key>}:o, beside its
// limits' states and in their Cluster slot; decide.lua and bucket.lua
// read it in the script call that decides, so an overridden key costs one
// more read inside Redis and no round trip. Setting or deleting one is a
// decide.lua item (see carry there) that moves the key's usage to its new
// limits in the same script call.

// encodeOverride writes limits as decide.lua reads them (see
// parseOverride in prelude.lua): "fg1", ";kind,quota,rate,period,alg" per
// limit, and after a newline the limits' names, which only Go reads.
func encodeOverride(limits []core.Spec) string {
	var b strings.Builder
	b.WriteString("fg1")
	names := make([]string, len(limits))
	named := false
	for i := range limits {
		sp := &limits[i]
		fmt.Fprintf(&b, ";%d,%d,%d,%d,%d", sp.Kind, sp.Quota, sp.Rate, sp.Period, sp.Alg)
		names[i] = sp.Name
		named = named || sp.Name != ""
	}
	if named {
		js, _ := json.Marshal(names) // strings always marshal
		b.WriteByte('\n')
		b.Write(js)
	}
	return b.String()
}

// decodeOverride reads what encodeOverride wrote, with the expiry that
// decide.lua adds ("fg1@<µs>;..."), checking every limit with its
// constructor.
func decodeOverride(raw string) ([]core.Spec, error) {
	head, tail, _ := strings.Cut(raw, "\n")
	// The mark, an optional expiry, and the limits after a ';' each: as
	// parseOverride (prelude.lua) reads them, so that Go and Lua agree on
	// which values are floodgate's.
	rest, marked := strings.CutPrefix(head, "fg1")
	if at, timed := strings.CutPrefix(rest, "@"); timed {
		_, rest, _ = strings.Cut(at, ";")
		rest = ";" + rest
	}
	rest, listed := strings.CutPrefix(rest, ";")
	if !marked || !listed {
		return nil, fmt.Errorf("%w: redis: override %q is not floodgate's", floodgate.ErrKey, raw)
	}
	var names []string
	if tail != "" {
		if err := json.Unmarshal([]byte(tail), &names); err != nil {
			return nil, fmt.Errorf("%w: redis: override names %q: %v", floodgate.ErrKey, tail, err)
		}
	}
	parts := strings.Split(rest, ";")
	specs := make([]core.Spec, len(parts))
	for i, part := range parts {
		f := strings.Split(part, ",")
		var v [5]int64
		var err error
		for j := 0; j < len(v) && len(f) == len(v) && err == nil; j++ {
			v[j], err = strconv.ParseInt(f[j], 10, 64)
		}
		if len(f) != len(v) || err != nil {
			return nil, fmt.Errorf("%w: redis: override %q is not floodgate's", floodgate.ErrKey, raw)
		}
		kind, period := core.Kind(v[0]), time.Duration(v[3])*time.Microsecond
		var sp core.Spec
		switch {
		case kind == core.Bucket:
			sp, err = core.NewBucket("override", v[2], period, v[1], "quota")
		case kind == core.Log && v[1] > core.MaxLogQuota && v[1] <= core.MaxQuota:
			// A log over the bound, set before there was one: read, so
			// that it can be listed and replaced; decide.lua refuses to
			// decide on it.
			sp, err = core.NewWindow(kind, "override", core.MaxLogQuota, period)
			sp.Quota, sp.Rate = v[1], v[1]
		default:
			sp, err = core.NewWindow(kind, "override", v[1], period)
		}
		if err != nil {
			return nil, fmt.Errorf("%w: redis: override %q: %w", floodgate.ErrKey, raw, err)
		}
		sp.Alg = uint8(v[4])
		if i < len(names) {
			sp.Name = names[i]
		}
		specs[i] = sp
	}
	return specs, nil
}

// overrides caches decoded overrides by their value: a hot overridden key
// is decoded once.
type overrideCache struct {
	mu sync.Mutex
	m  map[string][]core.Spec
}

const overrideCacheMax = 1024

func (c *overrideCache) decode(raw string) ([]core.Spec, error) {
	c.mu.Lock()
	specs, ok := c.m[raw]
	c.mu.Unlock()
	if ok {
		return specs, nil
	}
	specs, err := decodeOverride(raw)
	if err != nil {
		return nil, err
	}
	c.mu.Lock()
	if c.m == nil || len(c.m) >= overrideCacheMax {
		c.m = make(map[string][]core.Spec)
	}
	c.m[raw] = specs
	c.mu.Unlock()
	return specs, nil
}

// overrideKey returns the Redis key of key's override.
func (s *Store) overrideKey(key string) string {
	if strings.ContainsAny(key, "{}") {
		return s.prefix + hashTag(key) + key + ":o"
	}
	return s.prefix + "{" + key + "}:o"
}

// keyOfOverride returns the key whose override is the Redis key rk, and
// false for a Redis key that is not one.
func (s *Store) keyOfOverride(rk string) (string, bool) {
	rest, ok := strings.CutPrefix(rk, s.prefix)
	if !ok {
		return "", false
	}
	if rest, ok = strings.CutSuffix(rest, ":o"); !ok || !strings.HasPrefix(rest, "{") {
		return "", false
	}
	if inner := rest[1 : len(rest)-1]; strings.HasSuffix(rest, "}") && !strings.ContainsAny(inner, "{}") {
		return inner, inner != ""
	}
	_, key, ok := strings.Cut(rest, "}") // "{hash}" then the key
	return key, ok && s.overrideKey(key) == rk
}

var _ core.Policy = (*policy)(nil)

// SetOverride implements core.Policy in one script call, which sets
// or deletes the override and carries the key's usage over; then it lifts
// the key's cached denials in every process (lifts.go).
func (p *policy) SetOverride(ctx context.Context, key string, o *core.Override, st core.Strategy) error {
	if err := storekit.CheckOverride(key, o, st); err != nil {
		return err
	}
	s := p.s
	if s.closed.Load() {
		return floodgate.ErrClosed
	}
	raw, ttl := "", int64(0)
	if o != nil {
		raw, ttl = encodeOverride(o.Limits), o.TTL.Milliseconds()
	}
	keys := p.keys(key)
	msg, err := p.runCarry(ctx, key, keys, st, raw, ttl)
	if err != nil {
		return s.wrap(ctx, err)
	}
	if msg != "" {
		return s.wrap(ctx, errors.New(msg))
	}
	// Other processes' denial caches and leases drop the key (lifts.go).
	if s.leases != nil {
		s.leases.forget(key)
	}
	s.lift(ctx, strings.TrimSuffix(keys[0], p.suffixes[0]), false)
	return nil
}

// runCarry sends decide.lua's item "o" for key, whose Redis keys under p
// are keys, in one script call: raw is an override's value to set ("" deletes the key's
// override) with its TTL in ms, or "<" and old limits to carry the key
// from (see Rebase). It drops the key's cached denial, and returns the
// script's error reply, if any, as msg.
func (p *policy) runCarry(ctx context.Context, key string, keys []string, st core.Strategy, raw string, ttl int64) (msg string, err error) {
	s := p.s
	now := s.nowArg()
	params := p.params
	if p.calendar {
		params = p.calendarParams(now)
	}
	args := make([]any, 0, 9+2*len(params))
	args = append(args, s.extraTTL, len(params))
	for i := range params {
		args = params[i].appendArgs(args)
	}
	args = append(args, 1, "o", int(st), raw, ttl, now, len(params))
	for i := range params {
		args = append(args, i+1)
	}
	// The keys: the Policy's, the override key, limit 0's keys as a
	// bucket and as a fixed window (which markOverridden marks), and the
	// keys of the limits the key is carried to (an override) or from (a
	// rebase's) that the Policy's are not, and of the key's override as
	// far as this process knows it. decide.lua answers an override it
	// finds with other limits (a change in between) with those, and the
	// item goes again.
	okey := s.overrideKey(key)
	base := strings.TrimSuffix(okey, "o")
	declared := append(slices.Clip(keys), okey, base+"0b", base+"0f")
	var extra []string // the keys of the limits carried to or from
	if limits := strings.TrimPrefix(raw, "<"); limits != "" {
		specs, err := s.decoded.decode(limits)
		if err != nil {
			return "", err
		}
		extra = p.extraKeys(okey, specs)
		declared = append(declared, extra...)
	}
	for try := 1; ; try++ {
		res, err := p.s.run(ctx, entryDecide, s.overrideKeys.appendTo(declared, okey), args).Slice()
		if s.denials != nil {
			s.denials.forget(key)
		}
		if err != nil || len(res) == 0 {
			return "", err
		}
		msg, _ = res[0].(string)
		undeclared, ok := strings.CutPrefix(msg, "?")
		if !ok {
			if msg == "" && !strings.HasPrefix(raw, "<") {
				// The key's requests declare the new override's keys
				// (none once it is deleted).
				s.overrideKeys.put(okey, extra)
			}
			return msg, nil
		}
		got, over, _ := strings.Cut(undeclared, "\n")
		if got != okey || try == maxDeclare {
			return "", fmt.Errorf("%w: redis: the override of key %q changed %d times while it was set: %q", floodgate.ErrStore, key, try, msg)
		}
		if err := s.declareOverride(p, okey, over); err != nil {
			return "", err
		}
	}
}

// GetOverride implements core.Policy with a GET (and a TIME for an
// override that expires, when the time is the server's).
func (p *policy) GetOverride(ctx context.Context, key string) (core.Override, bool, error) {
	if err := storekit.CheckKey(key); err != nil {
		return core.Override{}, false, err
	}
	s := p.s
	if s.closed.Load() {
		return core.Override{}, false, floodgate.ErrClosed
	}
	raw, err := s.client.Get(ctx, s.overrideKey(key)).Result()
	if errors.Is(err, redis.Nil) {
		return core.Override{}, false, nil
	}
	if err != nil {
		return core.Override{}, false, s.wrap(ctx, err)
	}
	return s.readOverride(ctx, s.client, raw)
}

// readOverride decodes the override raw, read from c, with the time it
// has left; false when it has expired.
func (s *Store) readOverride(ctx context.Context, c redis.Cmdable, raw string) (core.Override, bool, error) {
	specs, err := s.decoded.decode(raw)
	if err != nil {
		return core.Override{}, false, err
	}
	o := core.Override{Limits: specs}
	if exp := expiresOf(raw); exp != 0 {
		now, err := s.nowOn(ctx, c)
		if err != nil {
			return core.Override{}, false, s.wrap(ctx, err)
		}
		if exp <= now {
			return core.Override{}, false, nil
		}
		o.TTL = time.Duration(arith.RoundUp(time.Duration(exp-now)*time.Microsecond, time.Millisecond)) * time.Millisecond
	}
	return o, true, nil
}

// ListOverrides implements core.Policy: it scans every server (every
// master of a Cluster) for override keys, and reads each.
func (p *policy) ListOverrides(ctx context.Context, fn func(key string, o core.Override) bool) error {
	s := p.s
	if s.closed.Load() {
		return floodgate.ErrClosed
	}
	stop := errors.New("stop")
	stopped := false
	scan := func(ctx context.Context, c redis.Cmdable) error {
		if stopped {
			return stop
		}
		iter := c.Scan(ctx, 0, escapeGlob(s.prefix)+"{*}*:o", 500).Iterator()
		for iter.Next(ctx) {
			rk := iter.Val()
			key, ok := s.keyOfOverride(rk)
			if !ok {
				continue
			}
			raw, err := c.Get(ctx, rk).Result()
			if errors.Is(err, redis.Nil) {
				continue // deleted or expired since the scan saw it
			}
			if err != nil {
				return err
			}
			o, ok, err := s.readOverride(ctx, c, raw)
			if err != nil {
				return err
			}
			if ok && !fn(key, o) {
				stopped = true
				return stop
			}
		}
		return iter.Err()
	}
	err := s.forEachServer(ctx, scan)
	if err == nil || errors.Is(err, stop) {
		return nil
	}
	if errors.Is(err, floodgate.ErrStore) {
		return err
	}
	return s.wrap(ctx, err)
}

// escapeGlob escapes the characters that SCAN's MATCH pattern treats
// specially.
func escapeGlob(s string) string {
	var b strings.Builder
	for _, r := range s {
		if strings.ContainsRune(`*?[]\{}^-`, r) {
			b.WriteByte('\\')
		}
		b.WriteRune(r)
	}
	return b.String()
}

// expiresOf returns when the override raw expires (µs on the decisions'
// time line), or 0 if it does not.
func expiresOf(raw string) int64 {
	at, ok := strings.CutPrefix(raw, "fg1@")
	if !ok {
		return 0
	}
	at, _, _ = strings.Cut(at, ";")
	n, _ := strconv.ParseInt(at, 10, 64)
	return n
}

// forEachServer calls fn with every server that holds keys, one at a
// time: each master of a Cluster, or the one server.
func (s *Store) forEachServer(ctx context.Context, fn func(ctx context.Context, c redis.Cmdable) error) error {
	cc, ok := s.client.(*redis.ClusterClient)
	if !ok {
		return fn(ctx, s.client)
	}
	var mu sync.Mutex // ForEachMaster calls at once; fn runs one at a time
	return cc.ForEachMaster(ctx, func(ctx context.Context, c *redis.Client) error {
		mu.Lock()
		defer mu.Unlock()
		return fn(ctx, c)
	})
}

// nowArg is the time a script call is sent with: the injected clock's,
// in µs, or -1 for the server's TIME.
func (s *Store) nowArg() int64 {
	if s.clock != nil {
		return s.clock.Now().UnixMicro()
	}
	return -1
}

// nowOn returns the decisions' time, µs: the injected clock's, or the
// server's TIME (on c).
func (s *Store) nowOn(ctx context.Context, c redis.Cmdable) (int64, error) {
	if s.clock != nil {
		return s.clock.Now().UnixMicro(), nil
	}
	t, err := c.Time(ctx).Result()
	if err != nil {
		return 0, err
	}
	return t.UnixMicro(), nil
}
