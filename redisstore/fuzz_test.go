package redisstore_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/floodgate/floodgate"
	"github.com/floodgate/floodgate/internal/testkit/redistest"
	"github.com/floodgate/floodgate/redisstore"
	"github.com/floodgate/floodgate/storetest"
)

// periods and rates chosen to stress the exact arithmetic: fractions that
// do not divide, sub-millisecond and month-long periods.
var (
	fuzzPeriods = []time.Duration{time.Microsecond, 333 * time.Microsecond, 500 * time.Millisecond, time.Second,
		7 * time.Second, time.Minute, time.Hour, 30 * 24 * time.Hour}
	fuzzRates = []int64{1, 2, 3, 7, 10, 1000, 300000, 1 << 40}
)

// fuzzLimit builds a limit from three bytes.
func fuzzLimit(a, b, c byte) floodgate.Limit {
	period := fuzzPeriods[int(b)%len(fuzzPeriods)]
	quota := int64(c%20) + 1
	rate := fuzzRates[int(b>>4)%len(fuzzRates)]
	switch a % 7 {
	case 0:
		return floodgate.TokenBucket(rate, period, quota)
	case 1:
		return floodgate.GCRA(quota-1, rate, period)
	case 2:
		return floodgate.LeakyBucket(quota, rate, period)
	case 3:
		return floodgate.FixedWindow(quota, period)
	case 4:
		return floodgate.SlidingLog(quota, period)
	case 5:
		return floodgate.SlidingWindow(quota, period)
	default:
		return floodgate.CalendarWindow(quota, floodgate.Calendar(c%3+1), time.FixedZone("", 3600*(int(b)%25-12)))
	}
}

// FuzzDifferential compares the Go algorithms (the memory store) with the
// Lua script (the Redis store) on random sequences of times, costs, keys
// and one or two limits, with charges, refunds, resets, groups of
// requests on both keys (AllowGroup), and overrides set and deleted with
// each strategy: every result must be identical. A short run is
// part of scripts/test; run longer with
//
//	go test -run - -fuzz FuzzDifferential -fuzztime 5m ./redisstore
func FuzzDifferential(f *testing.F) {
	srv := redistest.Start(f)
	client := srv.Client(f)
	f.Add([]byte{0, 3, 4, 0, 0, 0, 10, 1, 20, 1, 200, 2, 5, 0, 0, 1})
	f.Add([]byte{5, 0x31, 19, 1, 4, 0x20, 7, 90, 3, 0, 255, 0, 9, 1, 1, 130, 2, 7, 0})
	f.Add([]byte{4, 0x13, 2, 0, 50, 1, 50, 1, 50, 2, 10, 0, 200, 3})
	f.Add([]byte{6, 0x77, 4, 1, 1, 0x66, 12, 255, 1, 255, 1, 0, 255, 2, 128, 4})
	f.Add([]byte{4, 0x13, 3, 0, 0x19, 3, 0x09, 1, 0x29, 2, 0x09, 3, 0x11, 200, 0x19, 1})
	f.Fuzz(func(t *testing.T, data []byte) {
		if len(data) < 4 {
			return
		}
		limits := []floodgate.Limit{fuzzLimit(data[0], data[1], data[2])}
		data = data[3:]
		if data[0]%4 == 1 && len(data) >= 4 {
			limits = append(limits, fuzzLimit(data[1], data[2], data[3]))
			data = data[4:]
		} else {
			data = data[1:]
		}
		for _, l := range limits {
			if l.Validate() != nil {
				return
			}
		}
		memClock, redisClock := storetest.NewClock(storetest.Base), storetest.NewClock(storetest.Base)
		mem := floodgate.NewMemoryStore(&floodgate.MemoryOptions{Clock: memClock, SweepInterval: -1})
		defer mem.Close()
		red := newStore(t, client, &redisstore.Options{Prefix: fmt.Sprintf("fz%d:", prefixes.Add(1)), Clock: redisClock})
		defer red.Close()
		// gen sends everything through decide.lua, red sends lone bucket
		// and fixed window decisions through bucket.lua: both must match
		// Go.
		gen := newStore(t, client, &redisstore.Options{Prefix: fmt.Sprintf("fz%d:", prefixes.Add(1)), Clock: redisClock})
		gen.DisableFastPath()
		defer gen.Close()
		ctx := context.Background()
		memLim, redLim, genLim := limiter(t, mem, limits...), limiter(t, red, limits...), limiter(t, gen, limits...)
		now := storetest.Base
		for i := 0; i+1 < len(data) && i < 80; i += 2 {
			op, arg := data[i], data[i+1]
			// Time moves by a scaled step; one op in eight goes backwards,
			// and one of those by up to 255 times 5 days (3.5 years; a key
			// keeps a skew of up to 8.9 years), staying after 1970.
			step := time.Duration(arg) * fuzzPeriods[int(op>>5)%len(fuzzPeriods)] / 64
			if op%8 == 7 {
				step = -step
				if arg%4 == 3 && now.Year() > 2000 {
					step = -time.Duration(arg) * 40 * 24 * time.Hour / 8
				}
			}
			now = now.Add(step)
			memClock.Set(now)
			redisClock.Set(now)
			key := []string{"a", "b"}[op>>3&1]
			n := int64(op>>4&3) + int64(arg%3)
			if op&0x0f == 0x0e {
				n = 1 << 50
			}
			if op%16 == 15 {
				if err := memLim.Reset(ctx, key); err != nil {
					t.Fatal(err)
				}
				if err := redLim.Reset(ctx, key); err != nil {
					t.Fatal(err)
				}
				if err := genLim.Reset(ctx, key); err != nil {
					t.Fatal(err)
				}
				continue
			}
			if op%16 == 9 {
				// A group on both keys: all or nothing when arg is odd, the
				// first request forced when arg&2, and that request alone
				// when arg&4 (the fast path decides a group of one).
				group := func(lim *floodgate.Limiter) []floodgate.Request {
					g := []floodgate.Request{{Limiter: lim, Key: key, N: n, Force: arg&2 != 0}, {Limiter: lim, Key: "b", N: int64(arg % 5)}}
					if arg&4 != 0 {
						return g[:1]
					}
					return g
				}
				want, got := group(memLim), group(redLim)
				if err := floodgate.AllowGroup(ctx, want, arg&1 == 1); err != nil {
					t.Fatal(err)
				}
				if err := floodgate.AllowGroup(ctx, got, arg&1 == 1); err != nil {
					t.Fatalf("redis: %v", err)
				}
				for j := range want {
					if got[j].Result != want[j].Result {
						t.Fatalf("op %d at %s: group (all %v) request %d, n=%d limits %v:\nredis  %+v\nmemory %+v",
							i/2, now.Sub(storetest.Base), arg&1 == 1, j, want[j].N, limits, got[j].Result, want[j].Result)
					}
				}
				// genLim's keys catch up, as a group of their own.
				if err := floodgate.AllowGroup(ctx, group(genLim), arg&1 == 1); err != nil {
					t.Fatalf("decide.lua: %v", err)
				}
				continue
			}
			if op%16 == 5 && arg&1 == 1 {
				// Set (or, one time in four, delete) key's override, with
				// one of the four strategies: the carry-over must match too.
				st := floodgate.Strategy(arg >> 1 % 4)
				o := floodgate.Override{Limits: []floodgate.Limit{fuzzLimit(arg>>3%6, op, arg>>2)}}
				set := func(lim *floodgate.Limiter) error {
					if arg>>5%4 == 0 {
						return lim.DeleteOverride(ctx, key, st)
					}
					return lim.SetOverride(ctx, key, o, st)
				}
				for j, lim := range []*floodgate.Limiter{memLim, redLim, genLim} {
					if err := set(lim); err != nil && !errors.Is(err, floodgate.ErrInvalidLimit) {
						t.Fatalf("store %d: override %v: %v", j, o.Limits, err)
					}
				}
				continue
			}
			allow := (*floodgate.Limiter).AllowN
			switch op % 16 {
			case 13:
				allow = (*floodgate.Limiter).Charge // into debt, whatever the limits say
			case 11:
				allow = (*floodgate.Limiter).Refund
			}
			want, err := allow(memLim, ctx, key, n)
			if err != nil {
				t.Fatal(err)
			}
			got, err := allow(redLim, ctx, key, n)
			if err != nil {
				t.Fatalf("redis: %v", err)
			}
			if got != want {
				t.Fatalf("op %d at %s key %s n=%d limits %v:\nredis  %+v\nmemory %+v", i/2, now.Sub(storetest.Base), key, n, limits, got, want)
			}
			if got, err = allow(genLim, ctx, key, n); err != nil || got != want {
				t.Fatalf("op %d at %s key %s n=%d limits %v:\ndecide.lua %+v (%v)\nmemory     %+v", i/2, now.Sub(storetest.Base), key, n, limits, got, err, want)
			}
		}
	})
}
