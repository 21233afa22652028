package redisstore

import (
	"bytes"
	"context"
	_ "embed"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/floodgate/floodgate/internal/lib/arith"
	"github.com/floodgate/floodgate/internal/testkit/redistest"
)

// lua54Vectors ends the chunk that TestLua54 runs (testdata/lua54.lua).
//
//go:embed testdata/lua54.lua
var lua54Vectors string

// lua54Env is what a server gives the scripts, on a bare Lua 5.4: struct
// as 5.4's string.pack and unpack (the same formats), a redis table whose
// commands fail (the pure functions send none), and globals as strict as
// Dragonfly's and Redis's, where reading a global that does not exist
// (5.1's unpack, say) is an error.
const lua54Env = `struct = {pack = string.pack, unpack = string.unpack}
redis = {
  call = function() error('no server here') end,
  pcall = function() error('no server here') end,
  error_reply = function(s) return {err = s} end,
}
setmetatable(_G, {
  __index = function(_, name) error('the script read the global ' .. tostring(name) .. ', which does not exist', 2) end,
  __newindex = function(_, name) error('the script set the global ' .. tostring(name), 2) end,
})
`

// TestLua54 runs the scripts' pure functions (the steps of the limits,
// the states' and overrides' forms, mulDiv) on vectors of their own on
// Redis's Lua 5.1 and on Lua 5.4, Dragonfly's, and wants the same results
// from both, and mulDiv's equal to Go's: the Lua runs unchanged on
// either. Lua 5.4 is Debian's lua5.4, which scripts/test installs; in CI
// (CI=true, or FLOODGATE_REQUIRE_REDIS=1) a missing one fails the test.
func TestLua54(t *testing.T) {
	lua, err := exec.LookPath("lua5.4")
	if err != nil {
		if os.Getenv("CI") == "true" || os.Getenv("FLOODGATE_REQUIRE_REDIS") == "1" {
			t.Fatal("lua5.4 not found: install it (Debian: apt-get install lua5.4); scripts/test does")
		}
		t.Skip("lua5.4 not found; skipping (scripts/test installs it)")
	}
	// The vectors in a function of their own: the chunk's locals are near
	// Lua's limit of 200 in one function.
	chunk := expandLua(preludeSource+"init()\n"+bucketSource+decideSource+crossSource) + "return (function()\n" + lua54Vectors + "\nend)()\n"
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	cmd := exec.CommandContext(ctx, lua, "-")
	cmd.Stdin = strings.NewReader(lua54Env + "local function chunk()\n" + chunk + "\nend\nio.write(chunk())\n")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	got54, err := cmd.Output()
	if err != nil {
		t.Fatalf("lua5.4: %v\n%s", err, stderr.String())
	}
	got51, err := redistest.Start(t).Client(t).Eval(ctx, chunk, nil).Text()
	if err != nil {
		t.Fatalf("Redis: %v", err)
	}

	lines51, lines54 := strings.Split(got51, "\n"), strings.Split(string(got54), "\n")
	if len(lines51) < 1000 {
		t.Fatalf("Redis gave %d lines, want the vectors' thousand and more", len(lines51))
	}
	for i := range max(len(lines51), len(lines54)) {
		var l51, l54 string
		if i < len(lines51) {
			l51 = lines51[i]
		}
		if i < len(lines54) {
			l54 = lines54[i]
		}
		if l51 != l54 {
			t.Errorf("line %d: Lua 5.1 %q, Lua 5.4 %q", i+1, l51, l54)
		}
	}
	// mulDiv's results, Go's too; and the ones where 5.4 tells an
	// integer from a float hold integers.
	muls := 0
	for _, l := range lines54 {
		f := strings.Fields(l)
		switch {
		case len(f) == 6 && f[0] == "mulDiv":
			var v [5]int64
			for i := range v {
				v[i], err = strconv.ParseInt(f[i+1], 10, 64)
				if err != nil {
					t.Fatalf("%q: %v", l, err)
				}
			}
			if q, r := arith.MulDiv(v[0], v[1], v[2]); q != v[3] || r != v[4] {
				t.Errorf("mulDiv(%d, %d, %d) = %d, %d on Lua 5.4; Go's is %d, %d", v[0], v[1], v[2], v[3], v[4], q, r)
			}
			muls++
		case len(f) == 3 && f[0] == "integer" && f[2] != "true":
			t.Errorf("%q: not an integer on Lua 5.4", l)
		}
	}
	if muls < 300 {
		t.Errorf("%d mulDiv vectors, want 300 and more", muls)
	}
}
