package slot

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/floodgate/floodgate/core"
)

func TestNewBadInput(t *testing.T) {
	for _, tc := range []struct {
		n     int64
		lease time.Duration
	}{
		{0, time.Second}, {-1, time.Second}, {MaxSlots + 1, time.Second},
		{1, 0}, {1, -time.Second}, {1, core.MaxPeriod + time.Microsecond}, {1, time.Nanosecond},
	} {
		if _, err := New(tc.n, tc.lease); !errors.Is(err, core.ErrInvalidLimit) {
			t.Errorf("New(%d, %s) = %v, want core.ErrInvalidLimit", tc.n, tc.lease, err)
		}
	}
	if s, err := New(MaxSlots, core.MaxPeriod); err != nil || s.Validate() != nil {
		t.Errorf("New(MaxSlots, core.MaxPeriod) = %v, %v", err, s.Validate())
	}
	if err := (Spec{Slots: 3}).Validate(); !errors.Is(err, core.ErrInvalidLimit) {
		t.Errorf("a Spec without a lease validates: %v", err)
	}
}

// id returns a permit id for key: Step asks only that it be 1 to
// MaxPermitIDLen bytes (the form of the ids floodgate.Concurrency makes is
// storekit's to check).
func id(key string, b byte) string { return fmt.Sprintf("%s-%02x", key, b) }

// TestSlotStep walks one key of 2 slots and a lease of 10 through every
// case of the model.
func TestStep(t *testing.T) {
	s, err := New(2, 10*time.Microsecond)
	if err != nil {
		t.Fatal(err)
	}
	a, b, c := id("k", 1), id("k", 2), id("k", 3)
	steps := []struct {
		name string
		now  int64
		op   Op
		want Verdict
	}{
		{"first acquire", 100, Op{Acquire, a}, Verdict{OK: true, Held: 1, Expiry: 110}},
		{"N-th acquire", 102, Op{Acquire, b}, Verdict{OK: true, Held: 2, Expiry: 112}},
		{"N+1-th denied until the earliest expiry", 105, Op{Acquire, c}, Verdict{Held: 2, Retry: 5}},
		{"release", 106, Op{Release, a}, Verdict{OK: true, Held: 1}},
		{"double release changes nothing", 106, Op{Release, a}, Verdict{Held: 1}},
		{"acquire the freed slot", 107, Op{Acquire, c}, Verdict{OK: true, Held: 2, Expiry: 117}},
		{"extend", 111, Op{Extend, b}, Verdict{OK: true, Held: 2, Expiry: 121}},
		{"extend a released permit", 111, Op{Extend, a}, Verdict{Held: 2}},
		{"denied: c expires first", 112, Op{Acquire, a}, Verdict{Held: 2, Retry: 5}},
		{"c expired at its expiry, not before", 117, Op{Acquire, a}, Verdict{OK: true, Held: 2, Expiry: 127}},
		{"release after expiry changes nothing", 117, Op{Release, c}, Verdict{Held: 2}},
		{"extend after expiry changes nothing", 121, Op{Extend, b}, Verdict{Held: 1}},
		{"clock back: extend never shortens", 50, Op{Extend, a}, Verdict{OK: true, Held: 1, Expiry: 127}},
		{"everything expired", 200, Op{Release, a}, Verdict{Held: 0}},
	}
	var st State
	for _, step := range steps {
		before := State{Permits: append([]Permit(nil), st.Permits...)}
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

func TestStepErrors(t *testing.T) {
	s, _ := New(1, time.Second)
	a := id("k", 1)
	st, _, _ := s.Step(State{}, 0, Op{Acquire, a})
	for _, tc := range []struct {
		op   Op
		want error
	}{
		{Op{Acquire, a}, ErrInvalidPermit},
		{Op{Acquire, ""}, ErrInvalidPermit},
		{Op{Release, strings.Repeat("x", 100)}, ErrInvalidPermit},
		{Op{0, a}, core.ErrInvalidLimit},
	} {
		next, v, err := s.Step(st, 1, tc.op)
		if !errors.Is(err, tc.want) || v != (Verdict{}) || len(next.Permits) != 1 {
			t.Errorf("%v: %v %+v %+v", tc.op, err, v, next)
		}
	}
}

func TestShare(t *testing.T) {
	s, _ := New(5, time.Second)
	for n, want := range map[int64]int64{1: 5, 2: 2, 5: 1, 10: 1} {
		if got, err := s.Share(n); err != nil || got.Slots != want || got.Lease != s.Lease {
			t.Errorf("Share(%d) = %+v, %v", n, got, err)
		}
	}
	if _, err := s.Share(0); !errors.Is(err, core.ErrInvalidLimit) {
		t.Error(err)
	}
}
