package floodgate

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"
)

// TestMemEntryLayout checks what memEntry's comment promises on 64-bit
// platforms: 192 bytes (a size class whose objects start on a cache
// line), with the lock, full and the hot part of the first state in the
// first 64.
func TestMemEntryLayout(t *testing.T) {
	if unsafe.Sizeof(uintptr(0)) != 8 {
		t.Skip("the layout is for 64-bit platforms")
	}
	var e memEntry
	if got := unsafe.Sizeof(e); got != 192 {
		t.Errorf("memEntry is %d bytes, want 192", got)
	}
	if got := unsafe.Offsetof(e.one) + unsafe.Offsetof(e.one[0].Log); got != 64 {
		t.Errorf("the first state's Log starts at byte %d, want 64", got)
	}
	if unsafe.Offsetof(e.mu) != 0 || unsafe.Offsetof(e.full) >= 16 {
		t.Errorf("mu at %d and full at %d, want both in the first 16 bytes", unsafe.Offsetof(e.mu), unsafe.Offsetof(e.full))
	}
	var sh memShard
	if off, size := unsafe.Offsetof(sh.mu), unsafe.Sizeof(sh); off != 64 || size%64 != 0 {
		t.Errorf("memShard's lock at byte %d and its size %d, want 64 and a multiple of 64", off, size)
	}
	// What else a decision reads: the second line.
	for name, off := range map[string]uintptr{"key": unsafe.Offsetof(e.key), "hash": unsafe.Offsetof(e.hash), "dead": unsafe.Offsetof(e.dead), "nlim": unsafe.Offsetof(e.nlim), "use": unsafe.Offsetof(e.use)} {
		if off < 64 || off >= 128 {
			t.Errorf("%s at byte %d, want it in the second 64", name, off)
		}
	}
}

// stillClock is a clock that does not move: no limit refills under it.
type stillClock struct{ t time.Time }

func (c stillClock) Now() time.Time                                   { return c.t }
func (c stillClock) Sleep(ctx context.Context, _ time.Duration) error { return ctx.Err() }

// TestMemoryStoreConcurrentExact races decisions, which take an entry's
// lock alone once the key is protected, against everything that takes the
// shard's lock: groups, overrides set and deleted on the same keys with
// the as-is strategy (which keeps what each key has used), overrides on
// other keys of the store, sweeps, peeks and new keys. The clock stands
// still, so each key admits exactly its quota whatever the interleaving:
// a decision lost or run in the middle of a change shows as a count off
// by some.
func TestMemoryStoreConcurrentExact(t *testing.T) {
	const (
		keys    = 16
		quota   = 500
		workers = 8
	)
	ctx := context.Background()
	s := NewMemoryStore(&MemoryOptions{Clock: stillClock{time.Unix(1e9, 0)}, SweepInterval: -1, Shards: 4})
	defer s.Close()
	limit := TokenBucket(1, time.Hour, quota)
	lim, err := NewLimiter(s, []Limit{limit}, nil)
	if err != nil {
		t.Fatal(err)
	}
	var admitted [keys]atomic.Int64
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range quota * keys / workers * 3 / 2 {
				k := (i*7 + w) % keys
				key := fmt.Sprint("k", k)
				switch {
				case i%97 == 0 && w == 0:
					// A change of limits that keeps the key's usage, and
					// adds a second limit that never binds (so the entry
					// grows a state, and shrinks back when it goes).
					o := Override{Limits: []Limit{limit, TokenBucket(1_000_000, time.Second, 1_000_000)}}
					if err := lim.SetOverride(ctx, key, o, AsIs); err != nil {
						t.Error(err)
						return
					}
				case i%89 == 0 && w == 1:
					if err := lim.DeleteOverride(ctx, key, AsIs); err != nil {
						t.Error(err)
						return
					}
				case i%31 == 0:
					// A group on two keys, all or nothing.
					other := fmt.Sprint("k", (k+1)%keys)
					reqs := []Request{{Limiter: lim, Key: key, N: 1}, {Limiter: lim, Key: other, N: 1}}
					if err := AllowGroup(ctx, reqs, true); err != nil {
						t.Error(err)
						return
					}
					if reqs[0].Result.Allowed {
						admitted[k].Add(1)
						admitted[(k+1)%keys].Add(1)
					}
				case i%13 == 0:
					s.Sweep()
					if _, err := lim.Peek(ctx, key); err != nil {
						t.Error(err)
						return
					}
					// Another key of the store comes and, with an
					// override, makes its shard slow for a while.
					if _, err := lim.Allow(ctx, fmt.Sprint("other", w, i)); err != nil {
						t.Error(err)
						return
					}
				default:
					r, err := lim.Allow(ctx, key)
					if err != nil {
						t.Error(err)
						return
					}
					if r.Allowed {
						admitted[k].Add(1)
					}
				}
			}
		}()
	}
	wg.Wait()
	for k := range admitted {
		if got := admitted[k].Load(); got != quota {
			t.Errorf("key k%d admitted %d, want exactly %d", k, got, quota)
		}
	}
}

// TestMemoryStoreConcurrentEviction races decisions on protected keys
// against eviction in a store much smaller than its keys, and against
// resets: under -race, what matters is that nothing races or deadlocks
// and that the store stays within its bound.
func TestMemoryStoreConcurrentEviction(t *testing.T) {
	ctx := context.Background()
	s := NewMemoryStore(&MemoryOptions{Clock: stillClock{time.Unix(1e9, 0)}, SweepInterval: -1, Shards: 2, MaxKeys: 8})
	defer s.Close()
	lim, err := NewLimiter(s, []Limit{TokenBucket(1, time.Hour, 1000), SlidingLog(MaxLogQuota, time.Hour)}, nil)
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	for w := range 6 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 3000 {
				key := fmt.Sprint("k", (i*5+w)%24)
				var err error
				if i%50 == 0 {
					err = lim.Reset(ctx, key)
				} else {
					_, err = lim.Allow(ctx, key)
				}
				if err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	if n := s.Len(); n > 8 {
		t.Errorf("the store holds %d keys, more than MaxKeys 8", n)
	}
}
