package storekit

import (
	"errors"
	"fmt"
	"time"

	"github.com/floodgate/floodgate/core"
	"github.com/floodgate/floodgate/core/slot"
)

// IsInvalidInput reports whether err says that the request, not the
// store, was wrong: an invalid key, cost, limit or permit, or a wrong number of
// limits. Such an error is the caller's to fix; retrying, or answering
// from a fallback, would not help. It is floodgate.IsInvalidInput.
func IsInvalidInput(err error) bool {
	return errors.Is(err, core.ErrInvalidKey) || errors.Is(err, core.ErrInvalidCost) ||
		errors.Is(err, core.ErrInvalidLimit) || errors.Is(err, core.ErrNoLimits) ||
		errors.Is(err, slot.ErrInvalidPermit)
}

// CheckKey returns nil for a usable key, or an error wrapping
// core.ErrInvalidKey: the key is empty or longer than core.MaxKeyLen
// bytes. Any bytes are allowed.
func CheckKey(key string) error {
	switch {
	case key == "":
		return fmt.Errorf("%w: empty key", core.ErrInvalidKey)
	case len(key) > core.MaxKeyLen:
		return fmt.Errorf("%w: key is %d bytes, more than the maximum %d", core.ErrInvalidKey, len(key), core.MaxKeyLen)
	}
	return nil
}

// CheckCost returns nil for a cost of 0 or more, or an error wrapping
// core.ErrInvalidCost.
func CheckCost(n int64) error {
	if n < 0 {
		return fmt.Errorf("%w: cost must not be negative, got %d", core.ErrInvalidCost, n)
	}
	return nil
}

// CheckRequest returns nil for a request that a Policy's Take can
// decide: CheckKey's error for its key, else CheckCost's for its cost.
func CheckRequest(key string, n int64) error {
	if err := CheckKey(key); err != nil {
		return err
	}
	return CheckCost(n)
}

// CheckSpecs returns nil when specs can be prepared: 1 to core.MaxLimits
// specs, each valid (see core.Spec.Validate), whose sliding logs admit at
// most core.MaxLogQuota units together. Every store's Prepare calls it
// first.
func CheckSpecs(specs []core.Spec) error {
	switch {
	case len(specs) == 0:
		return fmt.Errorf("%w: no limits given", core.ErrNoLimits)
	case len(specs) > core.MaxLimits:
		return fmt.Errorf("%w: %d limits given, at most %d are allowed", core.ErrNoLimits, len(specs), core.MaxLimits)
	}
	for i := range specs {
		if err := specs[i].Validate(); err != nil {
			if len(specs) > 1 {
				return fmt.Errorf("limit %d: %w", i, err)
			}
			return err
		}
	}
	return checkLogQuotas(specs)
}

// checkLogQuotas returns nil when the sliding logs among specs admit at
// most core.MaxLogQuota units together, and otherwise an error wrapping
// core.ErrInvalidLimit: one request checks every limit of a set, so the
// bound on one request's work is on their sum.
func checkLogQuotas(specs []core.Spec) error {
	var sum int64
	for i := range specs {
		if specs[i].Kind == core.Log {
			sum += specs[i].Quota
		}
	}
	if sum > core.MaxLogQuota {
		return fmt.Errorf("%w: the sliding-log limits of one set add up to %d, more than the maximum %d: "+
			"a sliding log records every unit it admits; use sliding-window (the sliding window counter) for larger limits",
			core.ErrInvalidLimit, sum, core.MaxLogQuota)
	}
	return nil
}

// CheckGroup returns nil when every request of reqs has a valid key and
// cost, and otherwise the first one's error (CheckRequest's), saying which
// request it is. Store.TakeGroup calls it first. An empty group is valid: there
// is nothing to decide.
func CheckGroup(reqs []core.Request) error {
	for i := range reqs {
		if err := CheckRequest(reqs[i].Key, reqs[i].N); err != nil {
			if len(reqs) > 1 {
				return fmt.Errorf("request %d: %w", i, err)
			}
			return err
		}
	}
	return nil
}

// CheckOverride returns nil when key and o can be set, and otherwise an
// error wrapping core.ErrInvalidKey or core.ErrInvalidLimit (or
// core.ErrNoLimits) that says what is wrong.
func CheckOverride(key string, o *core.Override, st core.Strategy) error {
	if err := CheckKey(key); err != nil {
		return err
	}
	if st > core.ResetUsage {
		return fmt.Errorf("%w: unknown strategy %d", core.ErrInvalidLimit, st)
	}
	if o == nil {
		return nil
	}
	if err := CheckSpecs(o.Limits); err != nil {
		return err
	}
	for i := range o.Limits {
		if o.Limits[i].Calendar != 0 {
			return fmt.Errorf("%w: an override cannot be a calendar window (limit %d); use a fixed window of 24h, 168h or 720h", core.ErrInvalidLimit, i)
		}
	}
	switch {
	case o.TTL < 0:
		return fmt.Errorf("%w: override TTL must not be negative, got %s", core.ErrInvalidLimit, o.TTL)
	case o.TTL%time.Millisecond != 0:
		return fmt.Errorf("%w: override TTL must be whole milliseconds, got %s", core.ErrInvalidLimit, o.TTL)
	}
	return nil
}

// CheckRebase returns nil when scope and st can be rebased, and otherwise
// an error wrapping core.ErrInvalidKey or core.ErrInvalidLimit.
func CheckRebase(scope string, st core.Strategy) error {
	if err := CheckKey(scope); err != nil {
		return err
	}
	if st > core.ResetUsage {
		return fmt.Errorf("%w: unknown strategy %d", core.ErrInvalidLimit, st)
	}
	return nil
}

// CheckSlotOp returns nil for an operation a slot.Policy can apply on key:
// CheckKey's error for the key, else CheckPermitID's for the id, else an
// error wrapping core.ErrInvalidLimit for an unknown kind.
func CheckSlotOp(key string, op slot.Op) error {
	if err := CheckKey(key); err != nil {
		return err
	}
	if err := CheckPermitID(key, op.ID); err != nil {
		return err
	}
	if op.Kind < slot.Acquire || op.Kind > slot.Extend {
		return fmt.Errorf("%w: unknown slot operation %d", core.ErrInvalidLimit, op.Kind)
	}
	return nil
}
