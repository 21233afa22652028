package core

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"
)

func TestNewSlotsBadInput(t *testing.T) {
	for _, tc := range []struct {
		n     int64
		lease time.Duration
	}{
		{0, time.Second}, {-1, time.Second}, {MaxSlots + 1, time.Second},
		{1, 0}, {1, -time.Second}, {1, MaxPeriod + time.Microsecond}, {1, time.Nanosecond},
	} {
		if _, err := NewSlots(tc.n, tc.lease); !errors.Is(err, ErrInvalidLimit) {
			t.Errorf("NewSlots(%d, %s) = %v, want ErrInvalidLimit", tc.n, tc.lease, err)
		}
	}
	if s, err := NewSlots(MaxSlots, MaxPeriod); err != nil || s.Validate() != nil {
		t.Errorf("NewSlots(MaxSlots, MaxPeriod) = %v, %v", err, s.Validate())
	}
	if err := (SlotSpec{Slots: 3}).Validate(); !errors.Is(err, ErrInvalidLimit) {
		t.Errorf("a SlotSpec without a lease validates: %v", err)
	}
}

// id returns a permit id for key: Step asks only that it be 1 to
// MaxPermitIDLen bytes (the form of the ids floodgate.Concurrency makes is
// storekit's to check).
func id(key string, b byte) string { return fmt.Sprintf("%s-%02x", key, b) }

// TestSlotStep walks one key of 2 slots and a lease of 10 through every
// case of the model.
func TestSlotStep(t *testing.T) {
	s, err := NewSlots(2, 10*time.Microsecond)
	if err != nil {
		t.Fatal(err)
	}
	a, b, c := id("k", 1), id("k", 2), id("k", 3)
	steps := []struct {
		name string
		now  int64
		op   SlotOp
		want SlotVerdict
	}{
		{"first acquire", 100, SlotOp{Acquire, a}, SlotVerdict{OK: true, Held: 1, Expiry: 110}},
		{"N-th acquire", 102, SlotOp{Acquire, b}, SlotVerdict{OK: true, Held: 2, Expiry: 112}},
		{"N+1-th denied until the earliest expiry", 105, SlotOp{Acquire, c}, SlotVerdict{Held: 2, Retry: 5}},
		{"release", 106, SlotOp{Release, a}, SlotVerdict{OK: true, Held: 1}},
		{"double release changes nothing", 106, SlotOp{Release, a}, SlotVerdict{Held: 1}},
		{"acquire the freed slot", 107, SlotOp{Acquire, c}, SlotVerdict{OK: true, Held: 2, Expiry: 117}},
		{"extend", 111, SlotOp{Extend, b}, SlotVerdict{OK: true, Held: 2, Expiry: 121}},
		{"extend a released permit", 111, SlotOp{Extend, a}, SlotVerdict{Held: 2}},
		{"denied: c expires first", 112, SlotOp{Acquire, a}, SlotVerdict{Held: 2, Retry: 5}},
		{"c expired at its expiry, not before", 117, SlotOp{Acquire, a}, SlotVerdict{OK: true, Held: 2, Expiry: 127}},
		{"release after expiry changes nothing", 117, SlotOp{Release, c}, SlotVerdict{Held: 2}},
		{"extend after expiry changes nothing", 121, SlotOp{Extend, b}, SlotVerdict{Held: 1}},
		{"clock back: extend never shortens", 50, SlotOp{Extend, a}, SlotVerdict{OK: true, Held: 1, Expiry: 127}},
		{"everything expired", 200, SlotOp{Release, a}, SlotVerdict{Held: 0}},
	}
	var st SlotState
	for _, step := range steps {
		before := SlotState{Permits: append([]Held(nil), st.Permits...)}
		next, v, err := s.Step(st, step.now, step.op)
		if err != nil {
			t.Fatalf("%s: %v", step.name, err)
		}
		if v != step.want {
			t.Fatalf("%s: got %+v, want %+v", step.name, v, step.want)
		}
		if len(before.Permits) != len(st.Permits) {
			t.Fatalf("%s: Step changed its input", step.name)
		}
		if next.Live(step.now) != v.Held || int64(len(next.Permits)) != v.Held {
			t.Fatalf("%s: state %+v, held %d", step.name, next, v.Held)
		}
		st = next
	}
	if st.Permits != nil {
		t.Errorf("an empty key keeps %v", st.Permits)
	}
}

func TestSlotStepErrors(t *testing.T) {
	s, _ := NewSlots(1, time.Second)
	a := id("k", 1)
	st, _, _ := s.Step(SlotState{}, 0, SlotOp{Acquire, a})
	for _, tc := range []struct {
		op   SlotOp
		want error
	}{
		{SlotOp{Acquire, a}, ErrInvalidPermit},
		{SlotOp{Acquire, ""}, ErrInvalidPermit},
		{SlotOp{Release, strings.Repeat("x", 100)}, ErrInvalidPermit},
		{SlotOp{0, a}, ErrInvalidLimit},
	} {
		next, v, err := s.Step(st, 1, tc.op)
		if !errors.Is(err, tc.want) || v != (SlotVerdict{}) || len(next.Permits) != 1 {
			t.Errorf("%v: %v %+v %+v", tc.op, err, v, next)
		}
	}
}

func TestSlotShare(t *testing.T) {
	s, _ := NewSlots(5, time.Second)
	for n, want := range map[int64]int64{1: 5, 2: 2, 5: 1, 10: 1} {
		if got, err := s.Share(n); err != nil || got.Slots != want || got.Lease != s.Lease {
			t.Errorf("Share(%d) = %+v, %v", n, got, err)
		}
	}
	if _, err := s.Share(0); !errors.Is(err, ErrInvalidLimit) {
		t.Error(err)
	}
}
