package core

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"
)

func TestShare(t *testing.T) {
	tests := []struct {
		spec        Spec
		n           int64
		quota, rate int64
		period      time.Duration
	}{
		{must(NewBucket("token-bucket", 100, time.Minute, 100, "burst")), 4, 25, 100, 4 * time.Minute},
		{must(NewBucket("gcra", 30, time.Minute, 16, "max_burst+1")), 2, 8, 30, 2 * time.Minute},
		{must(NewBucket("token-bucket", 3, time.Second, 3, "burst")), 10, 1, 3, 10 * time.Second},
		{must(NewWindow(Fixed, "fixed-window", 1000, time.Hour)), 3, 333, 333, time.Hour},
		{must(NewWindow(Log, "sliding-log", 5, time.Second)), 10, 1, 1, time.Second},
		{must(NewWindow(Sliding, "sliding-window", 100, time.Minute)), 1, 100, 100, time.Minute},
		{must(NewCalendarWindow("fixed-window", 70, Day, nil)), 7, 10, 10, 24 * time.Hour},
		// A period that cannot stretch n times divides the rate instead.
		{must(NewBucket("token-bucket", 1000, MaxPeriod/2, 10, "burst")), 4, 2, 250, MaxPeriod / 2},
	}
	for _, tt := range tests {
		in := tt.spec
		in.Name = "x"
		s, err := in.Share(tt.n)
		if err == nil {
			err = s.Validate()
		}
		if err != nil {
			t.Errorf("%+v.Share(%d): %v", tt.spec, tt.n, err)
			continue
		}
		if s.Quota != tt.quota || s.Rate != tt.rate || time.Duration(s.Period)*time.Microsecond != tt.period || s.Name != "x" || s.Kind != tt.spec.Kind || s.Calendar != tt.spec.Calendar {
			t.Errorf("%+v.Share(%d) = %+v, want quota %d rate %d period %s", tt.spec, tt.n, s, tt.quota, tt.rate, tt.period)
		}
	}
	if _, err := must(NewBucket("token-bucket", 1, time.Second, 1, "burst")).Share(0); !errors.Is(err, ErrInvalidLimit) {
		t.Errorf("Share(0): %v", err)
	}
}

func TestValidate(t *testing.T) {
	good := must(NewBucket("token-bucket", 3, time.Second, 5, "burst"))
	cal := must(NewCalendarWindow("fixed-window", 5, Week, time.UTC))
	tests := []struct {
		name string
		edit func(s *Spec)
		ok   bool
	}{
		{"as built", func(*Spec) {}, true},
		{"renamed", func(s *Spec) { s.Name = "other" }, true},
		{"zero", func(s *Spec) { *s = Spec{} }, false},
		{"emission interval", func(s *Spec) { s.TQ++ }, false},
		{"tolerance", func(s *Spec) { s.TauR = 0 }, false},
		{"zero rate", func(s *Spec) { s.Rate = 0 }, false},
		{"unknown kind", func(s *Spec) { s.Kind = 9 }, false},
		{"window with a rate of its own", func(s *Spec) { *s = must(NewWindow(Fixed, "f", 5, time.Second)); s.Rate = 4 }, false},
		{"calendar without a zone", func(s *Spec) { *s = cal; s.Location = nil }, false},
		{"calendar, wrong period", func(s *Spec) { *s = cal; s.Period = 1 }, false},
	}
	for _, tt := range tests {
		s := good
		tt.edit(&s)
		if err := s.Validate(); (err == nil) != tt.ok || (err != nil && !errors.Is(err, ErrInvalidLimit)) {
			t.Errorf("%s: Validate() = %v, want ok=%v", tt.name, err, tt.ok)
		}
	}
}

// A sliding log records every unit it admits, so its limit bounds one
// request's work: each log admits at most MaxLogQuota, and the error names
// the way out. (storekit's TestLogQuotas holds the logs of one set to it
// together.)
func TestLogQuota(t *testing.T) {
	for _, q := range []int64{MaxLogQuota + 1, 1_000_000, 100_000_000} {
		_, err := NewWindow(Log, "sliding-log", q, 24*time.Hour)
		want := fmt.Sprintf("sliding-log limit must be at most %d, got %d", MaxLogQuota, q)
		if !errors.Is(err, ErrInvalidLimit) || !strings.Contains(err.Error(), want) || !strings.Contains(err.Error(), "sliding-window") {
			t.Errorf("NewWindow(Log, %d) = %v, want an ErrInvalidLimit saying %q and naming sliding-window", q, err, want)
		}
	}
	if _, err := NewWindow(Sliding, "sliding-window", 100_000_000, 24*time.Hour); err != nil {
		t.Errorf("a sliding window counter of 10^8: %v", err)
	}
}

// A forced charge fills a sliding log to twice its limit at most, in Step
// and in Commit alike: a charge that finds it full records nothing.
func TestLogChargeBound(t *testing.T) {
	l := must(NewWindow(Log, "sliding-log", 3, time.Second))
	var s State
	for i, want := range []int64{3, 6, 6, 6} {
		now := int64(i) * 1000
		_, d := l.Charge(&s, now, 3)
		l.Commit(&s, d, now, 3, true)
		var units int64
		for _, m := range s.Log {
			units += m.N
		}
		if s.C != want || units != want {
			t.Fatalf("charge %d: total %d in marks %v, want %d", i+1, s.C, s.Log, want)
		}
	}
	if len(s.Log) != 2 || s.Last != 1000 {
		t.Errorf("marks %v, latest charge %d: want two marks, the latest at 1000", s.Log, s.Last)
	}
}
