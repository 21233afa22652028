package dash

import (
	"strconv"
	"testing"
)

// A flood of distinct keys neither grows the sketch nor hides the keys
// denied most; counts are within their stated error.
func TestTopKeys(t *testing.T) {
	const k = 64
	top := newTopKeys(k)
	truth := map[string]uint64{}
	for i := range 200_000 {
		key := "flood" + strconv.Itoa(i) // each once
		if i%10 == 0 {
			key = "heavy" + strconv.Itoa(i%30) // 3 keys, about 6,000 times each
		}
		if i%7 == 0 {
			key = "hot"
		}
		truth[key]++
		top.Add("api", key)
	}
	if n := len(top.cur.byPair); n > k {
		t.Fatalf("the sketch holds %d counters, more than %d", n, k)
	}
	tops, _ := top.Top(5)
	got := tops["api"]
	if len(got) == 0 || got[0].Key != "hot" {
		t.Fatalf("top keys %+v, want hot first", got)
	}
	bound := uint64(200_000 / k)
	for _, g := range got {
		if g.Count < truth[g.Key] || g.Count-truth[g.Key] > g.Error || g.Error > bound {
			t.Errorf("%s: count %d error %d, true count %d, bound %d", g.Key, g.Count, g.Error, truth[g.Key], bound)
		}
	}
	for _, want := range []string{"heavy0", "heavy10", "heavy20"} {
		found := false
		for _, g := range got {
			found = found || g.Key == want
		}
		if !found && truth[want] > bound {
			t.Errorf("%s, denied %d times (more than N/k = %d), is not reported: %+v", want, truth[want], bound, got)
		}
	}
	top.rotate()
	top.rotate()
	if got, _ := top.Top(5); len(got) != 0 {
		t.Errorf("after two windows: %+v", got)
	}
}
