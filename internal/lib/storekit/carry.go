package storekit

import (
	"slices"

	"github.com/floodgate/floodgate/core"
	"github.com/floodgate/floodgate/internal/lib/arith"
)

// Carry returns how many units a limit of toQuota should have left so
// that it keeps what strategy st keeps of an old limit's fromRemaining of
// fromQuota: between 0 and toQuota. core.ResetUsage is not handled here:
// a store forgets the state instead.
//
// A store moves a key's state to it in at most three steps, each with
// operations every algorithm has in Go and in Lua. It peeks the new limit
// on the state as it stands; when that leaves more than the target, it
// charges the difference (Spec.Charge), which is exact on every
// algorithm; when it leaves less, it refunds the difference (Spec.Refund)
// and peeks again. A refund can fall short: a Remaining of 0 may hide a
// debt (a bucket whose TAT is far ahead, read at a faster rate), and a
// sliding window counter's refund restores less than it gives back. The
// store then starts the limit afresh and charges what the target leaves
// out. Either way the key keeps exactly the target, and where the state
// could be kept, its timing too.
func Carry(st core.Strategy, fromQuota, fromRemaining, toQuota int64) int64 {
	fromRemaining = max(fromRemaining, 0)
	var want int64
	switch {
	case st == core.Proportional:
		want, _ = arith.MulDiv(fromRemaining, toQuota, fromQuota)
	case st == core.Additive && toQuota >= fromQuota:
		want = fromRemaining + toQuota - fromQuota
	default: // AsIs, and Additive when the limit is lowered
		want = fromRemaining
	}
	return min(max(want, 0), toQuota)
}

// Rebasable reports whether Rebase carries keys from the limits from to
// the limits to: they decide differently (names do not count), and
// neither has a calendar window.
func Rebasable(from, to []core.Spec) bool {
	if slices.EqualFunc(from, to, func(a, b core.Spec) bool {
		a.Name, a.Alg, b.Name, b.Alg = "", 0, "", 0
		return a == b
	}) {
		return false
	}
	for _, l := range [][]core.Spec{from, to} {
		for i := range l {
			if l[i].Calendar != 0 {
				return false
			}
		}
	}
	return true
}
