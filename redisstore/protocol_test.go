package redisstore

import (
	"context"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/floodgate/floodgate/core"
	"github.com/floodgate/floodgate/internal/testkit/redistest"
)

// luaOwn are the Lua constants that are Lua's alone, with why: no Go code
// sends, reads or bounds by them, so they have no Go twin to drift from.
// Any other constant in the Lua must be one of Go's, written {{NAME}}.
var luaOwn = map[string]string{
	"TWO53":         "doubles' exact range, a fact of Lua's numbers",
	"TAKE":          "a step's mode inside Lua; the wire says it by the cost's sign and \"r\"",
	"CHARGE":        "as TAKE",
	"REFUND":        "as TAKE",
	"MARKS":         "the state tags markOverridden rewrites: states are Lua's alone",
	"NUMS_MAX":      "the size of a cache inside Lua",
	"SPECS_MAX":     "the size of a cache inside Lua",
	"POOL_MAX":      "the size of a pool inside Lua",
	"UNPACK_MAX":    "Lua's C stack bounds a command's arguments",
	"CROSS_NEW_MAX": "the bound of a counter inside Lua, of what a master's slots held lately",
}

// luaSources are the Lua files, by name.
var luaSources = map[string]string{"prelude.lua": preludeSource, "decide.lua": decideSource, "bucket.lua": bucketSource, "cross.lua": crossSource}

// luaLocal is a line that declares locals: their names, and their values.
var luaLocal = regexp.MustCompile(`^(\s*)local\s+([A-Za-z_]\w*(?:\s*,\s*[A-Za-z_]\w*)*)\s*=\s*(.*)$`)

var upperName = regexp.MustCompile(`^[A-Z][A-Z0-9_]*$`)

// luaLiteral is a value written out: a number, a string, a table
// constructor or a boolean (not an expression such as sp.quota).
var luaLiteral = regexp.MustCompile(`^(-?[0-9][0-9a-fA-FxX.eE+-]*|'.*'|".*"|\{.*\}|true|false)$`)

// luaConstant is a constant that a Lua source declares.
type luaConstant struct {
	name, value string // value as written, {{NAME}} for Go's
	where       string // file:line
	top         bool   // a local of the chunk, not of a function
}

// readLuaConstants returns the constants (locals with upper-case names)
// that the Lua sources declare.
func readLuaConstants(t *testing.T) []luaConstant {
	t.Helper()
	var out []luaConstant
	for file, src := range luaSources {
		for i, line := range strings.Split(src, "\n") {
			m := luaLocal.FindStringSubmatch(line)
			if m == nil || strings.HasPrefix(m[2], "function") {
				continue
			}
			names := strings.Split(m[2], ",")
			values := splitLuaValues(m[3])
			for j, name := range names {
				name = strings.TrimSpace(name)
				if !upperName.MatchString(name) || j >= len(values) ||
					!(luaLiteral.MatchString(values[j]) || luaPlaceholder.MatchString(values[j])) {
					continue // a variable, or an alias such as L = sp.quota
				}
				where := fmt.Sprintf("%s:%d", file, i+1)
				out = append(out, luaConstant{name: name, value: values[j], where: where, top: m[1] == ""})
			}
		}
	}
	return out
}

// splitLuaValues splits a declaration's values at the commas outside
// braces, brackets, parentheses and strings, dropping a trailing comment.
func splitLuaValues(s string) []string {
	var vals []string
	depth, start := 0, 0
	var quote byte
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case quote != 0:
			if c == '\\' {
				i++
			} else if c == quote {
				quote = 0
			}
		case c == '\'' || c == '"':
			quote = c
		case c == '{' || c == '[' || c == '(':
			depth++
		case c == '}' || c == ']' || c == ')':
			depth--
		case c == ',' && depth == 0:
			vals = append(vals, strings.TrimSpace(s[start:i]))
			start = i + 1
		case c == '-' && depth == 0 && strings.HasPrefix(s[i:], "--"):
			return append(vals, strings.TrimSpace(s[start:i]))
		}
	}
	return append(vals, strings.TrimSpace(s[start:]))
}

// Every constant in the Lua is Go's, written {{NAME}} and filled in from
// luaConstants, or one that luaOwn says is Lua's alone: a new literal copy
// of a Go constant cannot slip in, nor a placeholder of another name. Each
// of Go's is written in somewhere, and each of luaOwn's still exists.
// (This holds what TestLogBoundMatchesCore held for MAXLOG, for all.)
func TestLuaConstants(t *testing.T) {
	used, seen := map[string]bool{}, map[string]bool{}
	for _, c := range readLuaConstants(t) {
		switch {
		case c.value == "{{"+c.name+"}}":
			if _, ok := luaConstants[c.name]; !ok {
				t.Errorf("%s: %s is written {{%[2]s}}, which luaConstants (protocol.go) lacks", c.where, c.name)
			}
			used[c.name] = true
		case luaPlaceholder.MatchString(c.value):
			t.Errorf("%s: %s = %s: a constant takes Go's constant of its own name", c.where, c.name, c.value)
		default:
			if _, ok := luaOwn[c.name]; !ok {
				t.Errorf("%s: %s = %s is a literal: write it {{%[2]s}} with its Go value in luaConstants (protocol.go), or, if no Go code shares it, add it to luaOwn", c.where, c.name, c.value)
			}
			seen[c.name] = true
		}
	}
	for name := range luaConstants {
		if !used[name] {
			t.Errorf("luaConstants' %s is declared by no Lua source as {{%[1]s}}", name)
		}
	}
	for name := range luaOwn {
		if !seen[name] {
			t.Errorf("luaOwn's %s is declared by no Lua source: drop it", name)
		}
	}
}

// expandLua writes Go's values, the ones the protocol promises (written
// out here, so that a change of one is seen twice), leaves Lua's tables
// alone, and refuses a name it lacks; the function library holds no
// placeholder.
func TestExpandLua(t *testing.T) {
	for _, tt := range []struct{ in, want string }{
		{"local MAXLOG = {{MAXLOG}}", "local MAXLOG = " + strconv.Itoa(core.MaxLogQuota)},
		{"local MAXSKEW = {{MAXSKEW}}", "local MAXSKEW = 281474976710656"},
		{"local MAXDEBT = {{MAXDEBT}}", "local MAXDEBT = 1125899906842624"},
		{"{{BUCKET}}, {{FIXED}}, {{SLIDING}}, {{LOG}}", "1, 2, 3, 4"},
		{"{{SUFFIXES}} {{BUCKET_LETTER}} {{FIXED_LETTER}}", "'bfsl' 98 102"},
		{"{{ADDITIVE}}, {{AS_IS}}, {{PROPORTIONAL}}, {{RESET_USAGE}}", "0, 1, 2, 3"},
		{"{{RECORD_DECISION}}{{RECORD_OVERRIDE}}{{RECORD_ELSEWHERE}}{{RECORD_ERROR}}", "0123"},
		{"{{WINDOW_ARG}}, {{BUCKET_ARG}}", "40, 80"},
		{"{{CROSS_DECIDED}}, {{CROSS_REFUSED}}", "1, 2"},
		// Lua's own tables are no placeholders.
		{"local MARKS = {{'0b', {}}}", "local MARKS = {{'0b', {}}}"},
		{"{{x}} {{ MAXLOG }}", "{{x}} {{ MAXLOG }}"},
	} {
		if got := expandLua(tt.in); got != tt.want {
			t.Errorf("expandLua(%q) = %q, want %q", tt.in, got, tt.want)
		}
	}
	func() {
		defer func() {
			if r := recover(); r == nil || !strings.Contains(fmt.Sprint(r), "{{NOPE}}") {
				t.Errorf("expandLua of an unknown name: recovered %v, want a panic naming it", r)
			}
		}()
		expandLua("local NOPE = {{NOPE}}")
	}()
	if p := luaPlaceholder.FindString(scripts.libraryCode); p != "" {
		t.Errorf("the function library holds the placeholder %s", p)
	}
}

// The assembled code, run by Redis, holds Go's values: every constant of
// the chunk that is written {{NAME}} reads as luaConstants says.
func TestLuaConstantsOnRedis(t *testing.T) {
	var names []string
	for _, c := range readLuaConstants(t) {
		if c.top && luaPlaceholder.MatchString(c.value) {
			names = append(names, c.name)
		}
	}
	ret := make([]string, len(names))
	for i, n := range names {
		ret[i] = "v(" + n + ")"
	}
	code := expandLua(preludeSource+bucketSource+decideSource+crossSource) + "init()\n" +
		"local function v(x) if type(x) == 'number' then return format('%d', x) end return x end\n" +
		"return {" + strings.Join(ret, ", ") + "}\n"
	client := redistest.Start(t).Client(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	got, err := client.Eval(ctx, code, nil).StringSlice()
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != len(names) {
		t.Fatalf("Redis returned %d values for %d constants", len(got), len(names))
	}
	for i, name := range names {
		want := strings.Trim(luaConstants[name], "'")
		if got[i] != want {
			t.Errorf("%s reads %q in Redis, want %q", name, got[i], want)
		}
	}
	if len(names) < 10 {
		t.Errorf("only %d constants checked (%v): the parse of the sources missed some", len(names), names)
	}
}

// Every error the scripts make starts with errorPrefix, which wrap
// strips, and rebase.go's overriddenReply is decide.lua's. The one
// exception is prelude.lua's readError passing Redis's own error reply
// through: an ACL's NOPERM must reach the client as NOPERM, a key's
// failure, not as one of the scripts' own errors.
func TestLuaErrorsArePrefixed(t *testing.T) {
	reply := regexp.MustCompile(`error_reply\(('[^']*')?`)
	const passThrough = "return redis.error_reply(e)"
	n, passed := 0, 0
	for file, src := range luaSources {
		for i, line := range strings.Split(src, "\n") {
			for _, m := range reply.FindAllStringSubmatch(line, -1) {
				n++
				if m[1] == "" && file == "prelude.lua" && strings.TrimSpace(line) == passThrough {
					passed++
					continue
				}
				if msg := strings.Trim(m[1], "'"); !strings.HasPrefix(msg, errorPrefix) {
					t.Errorf("%s:%d: error_reply(%s...) does not start with %q", file, i+1, m[1], errorPrefix)
				}
			}
		}
	}
	if n < 7 {
		t.Errorf("found %d error replies, want the 7 or more the Lua makes", n)
	}
	if passed != 1 {
		t.Errorf("found %d pass-throughs of Redis's error (%s), want readError's one", passed, passThrough)
	}
	if want := "redis.error_reply('" + overriddenReply + "')"; !strings.Contains(decideSource, want) {
		t.Errorf("decide.lua lacks %s", want)
	}
}

// maxDebt is core's: a forced charge on a fixed window whose count is
// just under it stops at it, in core, as decide.lua's and bucket.lua's
// MAXDEBT makes it stop.
func TestMaxDebtMatchesCore(t *testing.T) {
	sp, err := core.NewWindow(core.Fixed, "w", 10, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	const now = 10_000_000 // µs, a window's start
	for _, tt := range []struct {
		count, want int64
	}{
		{maxDebt - 3, maxDebt},
		{maxDebt - 10, maxDebt},
		{maxDebt - 11, maxDebt - 1},
	} {
		s := core.State{Kind: core.Fixed, A: now, B: tt.count, Last: now}
		if _, d := sp.Charge(&s, now, 10); d.B != tt.want {
			t.Errorf("core's charge of 10 on a count of %d: %d, want %d", tt.count, d.B, tt.want)
		}
	}
}
