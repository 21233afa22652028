// Command memrss fills floodgate's memory store, at its default bounds,
// with more keys than it holds, and prints the process's resident memory:
//
//	cd bench && go run ./cmd/memrss -keylen 512 -keys 2000000
//
// Every key is new and stays below full for an hour, as in a flood of
// distinct keys, so the store holds as many as its bounds allow.
package main

import (
	"bufio"
	"context"
	"flag"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"strings"
	"time"

	"github.com/floodgate/floodgate"
)

func main() {
	keylen := flag.Int("keylen", 512, "bytes per key")
	keys := flag.Int("keys", 2_000_000, "distinct keys to send")
	flag.Parse()

	st := floodgate.NewMemoryStore(nil) // the default bounds
	defer st.Close()
	lim, err := floodgate.NewLimiter(st, []floodgate.Limit{floodgate.TokenBucket(1, time.Hour, 10)}, nil)
	if err != nil {
		panic(err)
	}
	ctx := context.Background()
	pad := strings.Repeat("k", max(0, *keylen-10))
	start := time.Now()
	for i := range *keys {
		if _, err := lim.Allow(ctx, pad+strconv.Itoa(1_000_000_000+i)); err != nil {
			panic(err)
		}
	}
	elapsed := time.Since(start)
	peak := rss("VmHWM")
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	fmt.Printf("%d keys of %d bytes sent in %s\n", *keys, *keylen, elapsed.Round(time.Millisecond))
	fmt.Printf("store: %d keys, %d MiB counted (MaxBytes 192 MiB), %d evictions\n", st.Len(), st.Bytes()>>20, st.Evictions())
	fmt.Printf("RSS: %d MiB now, %d MiB peak; Go heap in use %d MiB\n", rss("VmRSS")>>10, peak>>10, ms.HeapInuse>>20)
}

// rss returns a field of /proc/self/status in KiB.
func rss(field string) int64 {
	f, err := os.Open("/proc/self/status")
	if err != nil {
		return -1
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), field+":"); ok {
			n, _ := strconv.ParseInt(strings.Fields(v)[0], 10, 64)
			return n
		}
	}
	return -1
}
