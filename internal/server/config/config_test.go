package config

import (
	"strings"
	"testing"
	"time"

	"github.com/floodgate/floodgate"
)

func TestExample(t *testing.T) {
	c := Example()
	r, ok := c.Rule("example")
	if !ok || len(r.Limits) != 1 || r.Limits[0].String() != "example: token-bucket 10/1s burst 20" {
		t.Fatalf("built-in rule: %+v", r)
	}
}

func TestParse(t *testing.T) {
	y := `rules:
  - name: api
    algorithm: token-bucket
    rate: 100
    period: 1m
    burst: 200
  - name: funnel
    algorithm: leaky-bucket
    capacity: 10
    leak: 1
    period: 1s
  - name: cell
    algorithm: gcra
    max_burst: 15
    count: 30
    period: 60s
  - name: login
    algorithm: sliding-window
    limit: 5
    window: 1m
    shadow: true
  - name: exact
    algorithm: sliding-log
    limit: 200
    window: 1h
  - name: tiered
    limits:
      - {algorithm: gcra, max_burst: 9, count: 10, period: 1s, name: burst}
      - {algorithm: fixed-window, limit: 10_000, calendar: day, timezone: Europe/Paris, name: daily}
      - {algorithm: fixed-window, limit: 100, window: 1m}
`
	c, err := Parse("rules.yaml", []byte(y))
	if err != nil {
		t.Fatal(err)
	}
	want := map[string][]string{
		"api":    {"api: token-bucket 100/1m0s burst 200"},
		"funnel": {"funnel: leaky-bucket 1/1s burst 10"},
		"cell":   {"cell: gcra 30/1m0s burst 16"},
		"login":  {"login: sliding-window 5/1m0s"},
		"exact":  {"exact: sliding-log 200/1h0m0s"},
		"tiered": {"burst: gcra 10/1s burst 10", "daily: fixed-window 10000 per day (Europe/Paris)", "fixed-window 100/1m0s"},
	}
	if len(c.Rules) != len(want) {
		t.Fatalf("%d rules", len(c.Rules))
	}
	for name, limits := range want {
		r, ok := c.Rule(name)
		if !ok {
			t.Fatalf("no rule %s", name)
		}
		var got []string
		for _, l := range r.Limits {
			got = append(got, l.String())
		}
		if strings.Join(got, "|") != strings.Join(limits, "|") {
			t.Errorf("%s: %q, want %q", name, got, limits)
		}
	}
	if r, _ := c.Rule("login"); !r.Shadow {
		t.Error("login is not shadow")
	}
	if r, _ := c.Rule("cell"); r.Limits[0].Period() != time.Minute || r.Limits[0].Algorithm() != floodgate.AlgorithmGCRA {
		t.Errorf("cell: %v", r.Limits[0])
	}
}

func TestErrors(t *testing.T) {
	rule := func(body string) string { return "rules:\n  - name: r\n" + body }
	tests := []struct {
		name, yaml, want string
	}{
		{"empty", "", "f.yaml: the file is empty"},
		{"syntax", "rules: [", "f.yaml:1:8: did not find expected node content"},
		{"no rules", "other: 1\n", "f.yaml:1:1: other: unknown top-level field"},
		{"not a list", "rules: 3\n", "f.yaml:1:8: rules: must be a list"},
		{"no name", "rules:\n  - algorithm: gcra\n", "f.yaml:2:5: rules[0].name: missing"},
		{"bad name", "rules:\n  - name: a b\n    algorithm: gcra\n", `f.yaml:2:11: rules[0].name: must be 1 to 64 letters`},
		{"unknown algorithm", rule("    algorithm: bucket\n"), `f.yaml:3:16: rules[0].algorithm: unknown algorithm "bucket"`},
		{"nan rate", rule("    algorithm: token-bucket\n    rate: .nan\n    period: 1s\n    burst: 1\n"), "f.yaml:4:11: rules[0].rate: must be a whole number, got NaN (.nan)"},
		{"inf rate", rule("    algorithm: token-bucket\n    rate: .inf\n    period: 1s\n    burst: 1\n"), "f.yaml:4:11: rules[0].rate: must be a whole number, got infinity (.inf)"},
		{"negative inf", rule("    algorithm: token-bucket\n    rate: -.Inf\n    period: 1s\n    burst: 1\n"), "rules[0].rate: must be a whole number, got infinity"},
		{"fraction", rule("    algorithm: token-bucket\n    rate: 0.5\n    period: 1s\n    burst: 1\n"), "f.yaml:4:11: rules[0].rate: must be a whole number, got 0.5: write a longer period"},
		{"zero rate", rule("    algorithm: token-bucket\n    rate: 0\n    period: 1s\n    burst: 1\n"), "f.yaml:4:11: rules[0].rate: must be from 1 to 1099511627776, got 0"},
		{"negative", rule("    algorithm: sliding-log\n    limit: -1\n    window: 1s\n"), "f.yaml:4:12: rules[0].limit: must be from 1 to"},
		{"huge", rule("    algorithm: sliding-log\n    limit: 99999999999999999999\n    window: 1s\n"), "f.yaml:4:12: rules[0].limit: 99999999999999999999 is out of range"},
		{"bad duration", rule("    algorithm: sliding-log\n    limit: 1\n    window: 60\n"), `f.yaml:5:13: rules[0].window: must be a duration such as 1s, 1m or 500ms, got "60"`},
		{"refill too long", rule("    algorithm: token-bucket\n    rate: 1\n    period: 1h\n    burst: 1000000\n"), "f.yaml:2:5: rules[0]: token-bucket refills from empty in"},
		{"zero duration", rule("    algorithm: sliding-log\n    limit: 1\n    window: 0s\n"), "rules[0]: sliding-log period must be positive"},
		{"missing param", rule("    algorithm: gcra\n    count: 1\n    period: 1s\n"), "f.yaml:2:5: rules[0].max_burst: missing: gcra takes max_burst, count, period"},
		{"wrong param", rule("    algorithm: gcra\n    max_burst: 1\n    count: 1\n    period: 1s\n    burst: 3\n"), "f.yaml:7:12: rules[0].burst: is not a parameter of gcra"},
		{"unknown field", rule("    algorithm: gcra\n    colour: red\n"), "f.yaml:4:5: rules[0].colour: unknown field"},
		{"twice", rule("    algorithm: gcra\n    algorithm: gcra\n"), "f.yaml:4:5: rules[0].algorithm: given twice"},
		{"bad calendar", rule("    algorithm: fixed-window\n    limit: 1\n    calendar: year\n"), `f.yaml:5:15: rules[0].calendar: must be day, week or month, got "year"`},
		{"bad zone", rule("    algorithm: fixed-window\n    limit: 1\n    calendar: day\n    timezone: Mars/Olympus\n"), `f.yaml:6:15: rules[0].timezone: unknown time zone "Mars/Olympus"`},
		{"bad shadow", rule("    algorithm: sliding-log\n    limit: 1\n    window: 1s\n    shadow: maybe\n"), `rules[0].shadow: must be true or false`},
		{"duplicate", "rules:\n  - {name: a, algorithm: sliding-log, limit: 1, window: 1s}\n  - {name: a, algorithm: sliding-log, limit: 1, window: 1s}\n", `f.yaml:3:5: rules[1].name: "a" is already the name of rules[0]`},
		{"limits and algorithm", rule("    algorithm: gcra\n    limits: [{algorithm: sliding-log, limit: 1, window: 1s}]\n"), "rules[0].limits: give either limits or one limit's fields"},
		{"too many limits", rule("    limits: [" + strings.Repeat("{algorithm: sliding-log, limit: 1, window: 1s},", 9) + "]\n"), "rules[0].limits: must be a list of 1 to 8 limits"},
		{"sliding log over its maximum", rule("    algorithm: sliding-log\n    limit: 5_000_000\n    window: 24h\n"),
			"f.yaml:4:12: rules[0].limit: must be at most 250 for sliding-log, got 5000000: a sliding log records every unit it admits; use sliding-window"},
		{"nested sliding log over its maximum", rule("    limits:\n      - {algorithm: sliding-log, limit: 251, window: 1s}\n"),
			"f.yaml:4:41: rules[0].limits[0].limit: must be at most 250 for sliding-log, got 251"},
		{"sliding logs over the maximum together", rule("    limits:\n      - {algorithm: sliding-log, limit: 200, window: 1s}\n      - {algorithm: sliding-log, limit: 100, window: 1h}\n"),
			"f.yaml:4:7: rules[0].limits: the sliding-log limits add up to 300, more than the maximum 250: a sliding log records every unit it admits; use sliding-window"},
		{"nested error", rule("    limits:\n      - {algorithm: sliding-log, limit: 1.5, window: 1s}\n"), "f.yaml:4:41: rules[0].limits[0].limit: must be a whole number, got 1.5"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Parse("f.yaml", []byte(tt.yaml))
			if err == nil {
				t.Fatalf("no error, want %q", tt.want)
			}
			if !strings.Contains(err.Error(), tt.want) {
				t.Errorf("error:\n%v\nwant it to contain:\n%s", err, tt.want)
			}
		})
	}
}

// Every problem in a file is reported at once.
func TestAllErrors(t *testing.T) {
	_, err := Parse("f.yaml", []byte("rules:\n  - {name: a, algorithm: nope}\n  - {name: b, algorithm: gcra}\n"))
	es, ok := err.(Errors)
	if !ok || len(es) != 4 { // a's algorithm; b's max_burst, count, period
		t.Fatalf("errors: %v", err)
	}
}
