package config

import (
	"strings"
	"testing"
	"time"

	"github.com/floodgate/floodgate"
)

func TestParseOverride(t *testing.T) {
	tests := []struct {
		in       string
		limits   string // the limits' Strings, joined by "; "
		ttl      time.Duration
		strategy floodgate.Strategy
		err      string // a part of the error
	}{
		{in: `{"algorithm":"token-bucket","rate":100,"period":"1m","burst":50}`, limits: "token-bucket 100/1m0s burst 50"},
		{in: "algorithm: gcra\nmax_burst: 4\ncount: 10\nperiod: 1s\nname: fast\nttl: 90s\nstrategy: proportional",
			limits: "fast: gcra 10/1s burst 5", ttl: 90 * time.Second, strategy: floodgate.Proportional},
		{in: `{"limits":[{"algorithm":"sliding-log","limit":5,"window":"1s"},{"algorithm":"fixed-window","limit":1000,"window":"24h"}],"strategy":"as-is"}`,
			limits: "sliding-log 5/1s; fixed-window 1000/24h0m0s", strategy: floodgate.AsIs},
		{in: ``, err: "body: empty"},
		{in: `{"algorithm":"token-bucket","rate":0,"period":"1m","burst":5}`, err: "body:1:36: override.rate: must be from 1"},
		{in: `{"algorithm":"token-bucket","rate":1,"period":"1m","burst":5,"ttl":"-1s"}`, err: "ttl: must be a positive whole number"},
		{in: `{"algorithm":"token-bucket","rate":1,"period":"1m","burst":5,"strategy":"all"}`, err: "strategy: must be additive"},
		{in: `{"algorithm":"fixed-window","limit":5,"calendar":"day"}`, err: "cannot be a calendar window"},
		{in: `{"limits":[]}`, err: "limits: must be a list of 1 to 8 limits"},
		{in: `{"limit":5,"bogus":1}`, err: "bogus: unknown field"},
		{in: `{"algorithm":"sliding-log","limit":100000000,"window":"24h"}`,
			err: "body:1:36: override.limit: must be at most 250 for sliding-log, got 100000000: a sliding log records every unit it admits; use sliding-window"},
		{in: `{"limits":[{"algorithm":"sliding-log","limit":200,"window":"1s"},{"algorithm":"sliding-log","limit":200,"window":"1m"}]}`,
			err: "body:1:11: limits: the sliding-log limits add up to 400, more than the maximum 250"},
		{in: `{"algorithm":"token-bucket","rate":1,"period":"1m","burst":5,"limits":[]}`, err: "give either limits or one limit"},
	}
	for _, tt := range tests {
		o, err := ParseOverride("body", []byte(tt.in))
		if tt.err != "" {
			if err == nil || !strings.Contains(err.Error(), tt.err) {
				t.Errorf("ParseOverride(%q) error = %v, want one containing %q", tt.in, err, tt.err)
			}
			continue
		}
		if err != nil {
			t.Errorf("ParseOverride(%q): %v", tt.in, err)
			continue
		}
		var got []string
		for _, l := range o.Limits {
			got = append(got, l.String())
		}
		if strings.Join(got, "; ") != tt.limits || o.TTL != tt.ttl || o.Strategy != tt.strategy {
			t.Errorf("ParseOverride(%q) = %v, %s, %s; want %s, %s, %s", tt.in, got, o.TTL, o.Strategy, tt.limits, tt.ttl, tt.strategy)
		}
	}
}
