package redisstore

import (
	"fmt"
	"regexp"
	"strconv"
	"time"

	"github.com/floodgate/floodgate/core"
)

// This file declares the constants that the Go code and the Lua scripts
// share. The Lua holds none of them: each is written {{NAME}} in the .lua
// files, and expandLua writes Go's value in when the scripts are
// assembled, once, at init (see luaConstants). TestLuaConstants fails on a
// constant with a literal value in the Lua that is not Lua's own.

// errorPrefix starts every error message of the scripts: wrap strips it
// (TestLuaErrorsArePrefixed holds the Lua to it).
const errorPrefix = "FLOODGATE "

// The kinds of record in the fast path's reply (bucket.lua's RECORD_*).
const (
	recordDecision  = 0 // allowed, remaining, retry, reset
	recordOverride  = 1 // the same, then the key's override
	recordElsewhere = 2 // the key's override alone: decide.lua decides
	recordError     = 3 // the decision's error message
)

// windowArgLen and bucketArgLen are the lengths of a fixed window's and a
// bucket's argument, by which bucket.lua tells them apart.
const windowArgLen, bucketArgLen = 40, 80

// maxDebt is core's maxDebt, the most a window's forced count reaches
// (TestMaxDebtMatchesCore holds it to core's behaviour).
const maxDebt = 1 << 50

// luaConstants are the values of the {{NAME}}s in the Lua sources, as Lua
// literals.
var luaConstants = func() map[string]string {
	var suffixes []byte
	for k := core.Bucket; k <= core.Log; k++ {
		suffixes = append(suffixes, suffixOf(k))
	}
	m := map[string]string{
		"SUFFIXES": "'" + string(suffixes) + "'",
	}
	for name, v := range map[string]int64{
		"MAXSKEW":          int64(core.MaxPeriod / time.Microsecond),
		"MAXDEBT":          maxDebt,
		"MAXLOG":           core.MaxLogQuota,
		"BUCKET":           int64(core.Bucket),
		"FIXED":            int64(core.Fixed),
		"SLIDING":          int64(core.Sliding),
		"LOG":              int64(core.Log),
		"BUCKET_LETTER":    int64(suffixOf(core.Bucket)),
		"FIXED_LETTER":     int64(suffixOf(core.Fixed)),
		"ADDITIVE":         int64(core.Additive),
		"AS_IS":            int64(core.AsIs),
		"PROPORTIONAL":     int64(core.Proportional),
		"RESET_USAGE":      int64(core.ResetUsage),
		"RECORD_DECISION":  recordDecision,
		"RECORD_OVERRIDE":  recordOverride,
		"RECORD_ELSEWHERE": recordElsewhere,
		"RECORD_ERROR":     recordError,
		"WINDOW_ARG":       windowArgLen,
		"BUCKET_ARG":       bucketArgLen,
	} {
		m[name] = strconv.FormatInt(v, 10)
	}
	return m
}()

// luaPlaceholder is a {{NAME}} in the Lua sources: braces around an
// upper-case name, which no table of floodgate's Lua holds.
var luaPlaceholder = regexp.MustCompile(`\{\{[A-Z][A-Z0-9_]*\}\}`)

// expandLua returns src with each {{NAME}} replaced by luaConstants'
// value. An unknown name is a mistake in this package's own sources,
// which every test that loads a script would meet: it panics at init, as
// regexp.MustCompile does, rather than sending Redis a script that does
// not compile.
func expandLua(src string) string {
	return luaPlaceholder.ReplaceAllStringFunc(src, func(p string) string {
		v, ok := luaConstants[p[2:len(p)-2]]
		if !ok {
			panic(fmt.Sprintf("redisstore: the Lua sources name %s, which luaConstants lacks", p))
		}
		return v
	})
}
