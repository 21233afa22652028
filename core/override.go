package core

import (
	"strconv"
	"time"
)

// Strategy says what a key keeps of what it has used when its limits
// change: when an override is set or deleted. The four are bucket4j's
// TokensInheritanceStrategy. With a capacity of 100 and 40 units left,
// raised to 200, a key is left with 80 (Proportional), 40 (AsIs), 140
// (Additive) or 200 (ResetUsage).
//
// Every algorithm is treated alike, through its Remaining: the units it
// would admit now, in whole units (a bucket keeps the part of a unit it
// has refilled). Limit i of the old limits hands over to limit i of the
// new ones; a new limit with no old one at its index starts full.
type Strategy uint8

// The strategies. Additive is the zero value and the default.
const (
	// Additive keeps what was used: a raised limit adds the difference to
	// what is left (40 of 100, raised to 200: 140). A lowered limit keeps
	// what is left, up to the new quota, as AsIs does.
	Additive Strategy = iota
	// AsIs keeps what is left, up to the new quota (40 of 100: 40 of 200).
	AsIs
	// Proportional keeps the fraction that is left, rounded down (40 of
	// 100: 80 of 200).
	Proportional
	// ResetUsage forgets what was used: the key is full under its new
	// limits.
	ResetUsage
)

var strategyNames = [...]string{"additive", "as-is", "proportional", "reset"}

// String returns "additive", "as-is", "proportional" or "reset".
func (s Strategy) String() string {
	if int(s) < len(strategyNames) {
		return strategyNames[s]
	}
	return "Strategy(" + strconv.Itoa(int(s)) + ")"
}

// Override is a key's own limits: while it lasts, every Policy of the
// store decides the key against Limits instead of its own (see
// Policy.SetOverride).
type Override struct {
	// Limits are the key's limits, as Store.Prepare accepts them;
	// calendar windows are not allowed.
	Limits []Spec
	// TTL is how long the override lasts from when it is set, in whole
	// milliseconds (any such Duration, up to about 290 years); 0 for ever. GetOverride reports the time left. When an
	// override expires, the key's state is read under the Policy's limits
	// as it stands (the Additive strategy for limits that differ only in
	// quota); delete an override to choose.
	TTL time.Duration
}
