package redisstore

import (
	"context"
	"encoding/binary"
	"errors"
	"math"
	"slices"
	"strings"
	"testing"

	"github.com/floodgate/floodgate"
)

// TestBucketRecord reads the fast path's records (bucket.lua) as Redis
// sends them, one after another in a batch's reply, and refuses a reply it
// cannot read with ErrStore rather than a panic or a wrong decision.
func TestBucketRecord(t *testing.T) {
	decision := func(kind byte, v ...int64) string {
		b := []byte{kind}
		for _, x := range v {
			b = binary.BigEndian.AppendUint64(b, math.Float64bits(float64(x)))
		}
		return string(b)
	}
	counted := func(kind byte, s string) string {
		return string(binary.BigEndian.AppendUint32([]byte{kind}, uint32(len(s)))) + s
	}
	msg := "FLOODGATE wrong type: key k holds a value that is not floodgate state"
	tests := []struct {
		name  string
		reply string
		want  []int64 // nil: an error
		err   error   // the error, when want is nil
		inErr string  // in its message
		rest  string
	}{
		{"decision", decision(recordDecision, 1, 9, 0, 100000), []int64{1, 9, 0, 100000}, nil, "", ""},
		{"denial, never", decision(recordDecision, 0, 0, -1, 5), []int64{0, 0, -1, 5}, nil, "", ""},
		{"largest exact", decision(recordDecision, 1, 1<<53, 0, 1<<52), []int64{1, 1 << 53, 0, 1 << 52}, nil, "", ""},
		{"then another", decision(recordDecision, 1, 2, 0, 3) + decision(recordDecision, 0, 0, 7, 3), []int64{1, 2, 0, 3}, nil, "", decision(recordDecision, 0, 0, 7, 3)},
		{"elsewhere", counted(recordElsewhere, "fg1;2,9,9,1000000,0"), nil, errNotFast, "", ""},
		{"error", counted(recordError, msg), nil, floodgate.ErrStore, "redis: wrong type", ""},
		{"error, then a decision", counted(recordError, msg) + decision(recordDecision, 1, 1, 0, 1), nil, floodgate.ErrStore, "wrong type", decision(recordDecision, 1, 1, 0, 1)},
		{"empty", "", nil, floodgate.ErrStore, "empty", ""},
		{"unknown kind", decision(9, 1, 1, 0, 1), nil, floodgate.ErrStore, "cannot read", ""},
		{"short decision", decision(recordDecision, 1, 1, 0, 1)[:30], nil, floodgate.ErrStore, "cannot read", ""},
		{"override cut short", decision(recordOverride, 1, 1, 0, 1) + "\x00\x00", nil, floodgate.ErrStore, "cannot read", ""},
		{"length past the end", counted(recordError, msg)[:20], nil, floodgate.ErrStore, "cannot read", ""},
		{"huge length", "\x03\xff\xff\xff\xffabc", nil, floodgate.ErrStore, "cannot read", ""},
	}
	s := &Store{}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := &call{ctx: context.Background(), p: &policy{s: s}}
			out, rest, err := s.bucketRecord(c, tt.reply)
			if tt.want != nil {
				if err != nil || !slices.Equal(out, tt.want) || rest != tt.rest {
					t.Fatalf("got %v, rest %q, %v; want %v, rest %q", out, rest, err, tt.want, tt.rest)
				}
				return
			}
			if out != nil || !errors.Is(err, tt.err) || !strings.Contains(err.Error(), tt.inErr) {
				t.Fatalf("got %v, %v; want %v with %q", out, err, tt.err, tt.inErr)
			}
			if rest != tt.rest {
				t.Errorf("rest %q, want %q", rest, tt.rest)
			}
		})
	}
}
