package storekit

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/floodgate/floodgate/core"
	"github.com/floodgate/floodgate/core/slot"
)

func must(s core.Spec, err error) core.Spec {
	if err != nil {
		panic(err)
	}
	return s
}

// A sliding log records every unit it admits, so its limit bounds one
// request's work: the logs of one set together admit at most
// core.MaxLogQuota, and the error names the way out.
func TestLogQuotas(t *testing.T) {
	log := func(q int64) core.Spec {
		s, _ := core.NewWindow(core.Log, "sliding-log", q, time.Hour)
		return s
	}
	counter := must(core.NewWindow(core.Sliding, "sliding-window", 5_000_000, 24*time.Hour))
	for _, tt := range []struct {
		name  string
		specs []core.Spec
		ok    bool
	}{
		{"at the maximum", []core.Spec{log(core.MaxLogQuota)}, true},
		{"two that fit", []core.Spec{log(core.MaxLogQuota - 50), log(50), counter}, true},
		{"two over the maximum together", []core.Spec{log(core.MaxLogQuota), log(1)}, false},
		{"eight small ones over it", []core.Spec{log(40), log(40), log(40), log(40), log(40), log(40), log(40)}, false},
		{"counters are not logs", []core.Spec{counter, counter}, true},
	} {
		err := CheckSpecs(tt.specs)
		if (err == nil) != tt.ok || (err != nil && (!errors.Is(err, core.ErrInvalidLimit) || !strings.Contains(err.Error(), "sliding-window"))) {
			t.Errorf("%s: CheckSpecs = %v, want ok=%v", tt.name, err, tt.ok)
		}
	}
}

func id(key string, b byte) string { return NewPermitID(key, [16]byte{b}) }

func TestPermitIDs(t *testing.T) {
	a := id("k", 1)
	if len(a) != PermitIDLen || PermitIDLen > slot.MaxPermitIDLen {
		t.Fatalf("len(%q) = %d", a, len(a))
	}
	if err := CheckPermitID("k", a); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ key, id, want string }{
		{"k", "", "empty"},
		{"k", strings.Repeat("a", slot.MaxPermitIDLen+1), "more than the maximum"},
		{"k", "abc", "not a permit id"},
		{"k", strings.ToUpper(a), "not a permit id"},
		{"k", a[:32] + "+" + a[33:], "not a permit id"},
		{"other", a, "another key"},
	} {
		err := CheckPermitID(tc.key, tc.id)
		if !errors.Is(err, slot.ErrInvalidPermit) || !strings.Contains(err.Error(), tc.want) || !IsInvalidInput(err) {
			t.Errorf("CheckPermitID(%q, %q) = %v, want %q", tc.key, tc.id, err, tc.want)
		}
	}
	if err := CheckSlotOp("k", slot.Op{Kind: 9, ID: a}); !errors.Is(err, core.ErrInvalidLimit) {
		t.Errorf("unknown kind: %v", err)
	}
	if err := CheckSlotOp("", slot.Op{Kind: slot.Acquire, ID: a}); !errors.Is(err, core.ErrInvalidKey) {
		t.Errorf("empty key: %v", err)
	}
}
