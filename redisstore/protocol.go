package redisstore

import (
	"fmt"
	"regexp"
	"strconv"
	"time"

	"github.com/floodgate/floodgate/core"
)

// This file is the contributor's reference to the protocol between the Go
// code and the Lua scripts, and it declares the constants the two share.
// The Lua holds none of them: each is written {{NAME}} in the .lua files,
// and expandLua writes Go's value in when the scripts are assembled, once,
// at init (see luaConstants). TestLuaConstants fails on a constant with a
// literal value in the Lua that is not Lua's own.
//
// # Assembly
//
// prelude.lua (shared code: the bucket and fixed window steps, the state
// forms, overrides, errors) comes first. As scripts (EVALSHA): a line that
// saves KEYS and ARGV, prelude, "init()", then decide.lua or bucket.lua,
// then a line that calls decideBatch, bucketOne or bucketBatch with them
// (scriptSet). As a Redis 7 function library (FCALL): prelude, bucket.lua,
// decide.lua and cross.lua in one chunk, named by a hash of its expanded
// code, with functions <name>_bucket, _buckets and _decide, and the three
// that take their keys as arguments (see Keys): _buckets_argkeys,
// _decide_argkeys and _cross (library in fastpath.go). The concurrency
// limits' slots.lua, which shares no code with them, is the script's
// function slotsCall, and the library's <name>_slots.
// Every number on the wire and in a state is an integer below 2^53, which
// a double holds exactly. The code runs unchanged on Lua 5.1 (Redis,
// Valkey) and 5.4 (Dragonfly); see TestLua54.
//
// # Keys
//
// Limit i (from 0) of a key keeps its state in "<prefix>{key}:<i><letter>",
// the letter its kind's: b bucket, f fixed window, s sliding window
// counter, l sliding log (suffixOf; SUFFIXES in Lua). The key's override
// is "<prefix>{key}:o". A key that holds braces itself is preceded by a
// hash of it instead (hashTag): "<prefix>{<hash>}<key>:<i><letter>". All
// of a key's Redis keys share its Cluster slot.
//
// Every key a script names is one of the call's keys, which the client
// computes and declares in KEYS: a request's limits' keys and its
// override key, a carry's (decide.lua's item "o") marks of limit 0's
// states, the keys of an override's limits. The Lua builds none; it looks
// an override's limits' keys up among the call's, and sends an item whose
// keys are missing back (see decide.lua: reply). The entry functions take
// the list as a table (bucketOne's two keys, bucketBatch's and
// decideBatch's keys) and never read KEYS themselves, so that a call that
// cannot declare its keys, a Cluster call across slots (which Redis
// refuses as CROSSSLOT when declared, and runs under the function flag
// allow-cross-slot-keys), may pass the same list as arguments: the
// library's functions <name>_buckets_argkeys and _decide_argkeys take
// no keys and the arguments "number of keys, the keys, then the usual
// arguments" (argKeysArgs, argKeys in prelude.lua). That call is the one
// exception; TestDeclaredKeys holds every other to declared keys, and
// TestKeysAsArgs the exception to the same results. Even under the flag,
// one command may name keys of one slot only: decide.lua's commands each
// name one key, but bucketBatch's MGET and EXISTS name a batch's keys,
// so a call of the fast path across slots needs them split by slot. That
// is _cross (crossBatch in cross.lua, sendCross in cross.go), the
// exception's one use outside the tests: the fast path's batch of every
// slot of a Cluster master, in parts of one slot each, after one argument
// of the parts' sizes ('>I4I4' each: the part's keys and arguments), each
// "the slot's probe key, the keys, the arguments", each part's keys and
// arguments bucketBatch's (a key map
// included: a part's lone requests, first, still have the first keys as
// their own; an argument map too, which crossBatch expands before it
// counts them). The probe key
// is "<first key>:probe", which floodgate never writes; the reply is a
// record per part, CROSS_DECIDED with bucketBatch's reply, or
// CROSS_REFUSED when the node does not serve the slot stably (nothing of
// the part was read or written). Its requests that the fast path does not
// decide are answered RECORD_ELSEWHERE as in bucketBatch, never "?", and
// go on per slot to decide.lua, which declares their keys.
//
// # decide.lua: arguments
//
// Any batch of requests on any limits, and overrides. KEYS are the keys
// of every item in order: for a request its nk state keys then its
// override key; for an override item its nb state keys, its override key,
// and its limit 0's keys as a bucket and as a fixed window
// ("<prefix>{key}:0b", "…:0f", which setting an override marks). After
// them, the keys of overrides' limits that are none of their requests'
// state keys, in any order (overrideKeys, extraKeys).
// ARGV, decimal strings unless said otherwise:
//
//	1        extra: ms added to every expiry (Store.extraTTL: 0 on the
//	         server's clock, a margin with an injected Clock)
//	2        nspecs, the distinct limits of the call
//	3..      one argument per spec: 11 big-endian doubles, 88 bytes
//	         (scriptSpec.appendArgs): kind, quota, rate, period (µs),
//	         tauQ, tauR (a bucket's τ = tauQ + tauR/rate µs), tq, tr
//	         (T = period/rate = tq + tr/rate µs), c0, c1, c2 (a calendar
//	         window's [c0, c1) holding the client's now and [c1, c2) the
//	         next; else 0)
//	3+nspecs items, the number of items that follow
//
// An item is one of:
//
//	request  nk ("a<nk>": advisory, a group member whose denial does not
//	         undo the group), n (cost; 0 peeks, -n forces a charge of n as
//	         core's Spec.Charge, "r<n>" refunds n as Spec.Refund), now (µs,
//	         or -1 for the server's TIME), then nk spec indexes (from 1)
//	group    "g<count>" (or "G<count>": all or nothing, core's
//	         Grouper.TakeGroup), then count requests
//	override "o", strategy (core.Strategy: ADDITIVE..RESET_USAGE), raw
//	         (an override's value to set, "" to delete the key's, or "<" and
//	         old limits in the override's form, which a Rebase carries the
//	         key from), ttl (ms, 0 none), now (µs or -1), nb, then nb spec
//	         indexes: the Policy's limits, whose keys are next in KEYS
//
// # decide.lua: reply
//
// An array. For each request in order: when the key has an override, the
// string "=" and the override's value, then 4 integers per limit
// decided (the override's, if any): allowed (0, 1, or 2 for a charge an
// all-or-nothing group undid), remaining, retry (µs, -1 never), reset
// (µs). A group answers its members' in order. A request, group or
// override item that fails answers one string instead, its error message
// (see Errors); the other items are unaffected. An override item answers
// nothing when it succeeds. decideEngine.decode and readOut read it.
//
// An item on a key whose override has limits whose keys the call did not
// declare answers, undecided and changing nothing, "?", the override key,
// a newline and the override: the client records the keys it needs
// (overrideKeys) and sends the item again (decideEngine, runCarry), at most
// maxDeclare times in all.
//
// # bucket.lua: arguments
//
// The fast path: one request on a lone bucket or a fixed window that is
// not a calendar one. KEYS: limit 0's state key of each request, then
// the override key of each, in the same order.
// bucketOne (_bucket, scriptSet.bucket) decides KEYS[1], whose override
// key is KEYS[2], with ARGV[1]; bucketBatch (_buckets, scriptSet.buckets)
// decides each key of the first half of KEYS in order. A batch whose
// requests repeat keys in runs (a hot key's: Redis parses and checks
// each declared key) may instead declare each distinct state key once,
// in the order of their first requests, then their override keys in the
// same order (KEYS[d + j] is still KEYS[j]'s override key), and end ARGV
// with a key map (distinctKeys, expandKeys): the byte KEY_MAP (keyMapMark,
// 'k', which starts no other argument), the number of requests, then for
// each run of consecutive requests on one key, in order, the key's place
// among the distinct keys (from 1) and the run's length, all 2 big-endian
// bytes. bucketBatch expands it into the form above before anything else.
// A batch without repeats, or whose repeats are scattered (fewer key
// pairs saved than runs), has no map, and its keys and arguments are the
// ones above. A batch without a key map whose arguments repeat in runs
// (the requests of one Policy and cost on the server's clock carry the
// same bytes, and Redis parses each argument and Lua takes each into
// ARGV, once per request) may instead send each run's
// argument once, and end ARGV with an argument map (argRuns,
// expandArgs): the byte ARG_MAP (argMapMark, 'a'), then for each of the
// arguments before it, in order, how many times it stands (2 big-endian
// bytes). bucketBatch, and crossBatch for each part, expand it into the
// form below before anything else. Each request is one argument, which
// says by its length what it decides (fastArgs):
//
//	bucketArgLen (80) 10 big-endian doubles: now (µs, -1 server's TIME),
//	                  n (0 peeks, > 0 takes, < 0 refunds -n), extra (ms),
//	                  quota, rate, period (µs), tauQ, tauR, and n*T as
//	                  iq + ir/rate µs for n ≤ quota (0, 0 for a refund:
//	                  Lua computes it, as an override may change the rate)
//	windowArgLen (40) 5 big-endian doubles: now, n (0 peeks, > 0 takes,
//	                  < 0 forces a charge of -n), extra, quota, period
//
// One byte more (81, 41; a zero, unread) says another request of the
// call names the same key, whose state the call then keeps in a table
// (bucketsEngine.encode puts such requests after the others). In bucketBatch, "g<count>" (shorter than
// windowArgLen) precedes the count requests of a group that is not all or
// nothing, decided whole by the fast path or not at all. "G<count>" does
// the same for a group that is all or nothing (decideAll: a denial gives
// back the others' charges within the call, as decide.lua's decideGroup),
// and "H<count>" for one with advisory requests, followed by an argument
// of count bytes that flags them ('1') before the requests' own.
//
// # bucket.lua: reply
//
// One string, the requests' records one after the other (bucketRecord
// reads one). A record is a byte, its kind, then:
//
//	recordDecision  (0) allowed (0/1), remaining, retry, reset: 4 big-endian doubles
//	recordOverride  (1) the same, then the key's override: a 4-byte
//	                    big-endian length and the value
//	recordElsewhere (2) the key's override alone (length and value): the
//	                    fast path does not decide it, decide.lua must
//	                    (errNotFast, handOn)
//	recordError     (3) the decision's error message (length and bytes)
//
// A group the fast path does not decide answers, for each member, the
// same record: the first error, or the override that sends it elsewhere.
// In an all-or-nothing group that a denial undid, each request that was
// charged answers the state after its charge was given back, with
// allowed 2.
// bucketOne answers a failure as a Redis error reply, not a record.
//
// # States
//
// Only Lua reads and writes them (prelude.lua's parseBucket, fmtBucket,
// parseFixed, fmtFixed; decide.lua's parseSliding, stepLog), so their
// forms have one source there, and no Go twins. A bucket: '>Bddd' (25
// bytes: tag, tat, tat-last, e) or '>Bdddddd' (49: tag, tat, tat-last, e,
// f, R, skew); tag 1 short and 2 long for a key that has no override, 3
// and 4 for one that may. A fixed window: '>Bddddd' (41: tag, start, end, count, last, skew),
// tag 5 no override, 6 may. Setting an override turns 1, 2 and 5 into 3,
// 4 and 6 in place (markOverridden), so the fast path reads the override
// only when the tag says there may be one. A sliding window counter:
// "start:previous:current:last:skew". A sliding log: a sorted set, one
// member "t:j" scored t per admitted unit, and "~skew" scored as the
// newest mark when the key runs ahead of the clock. Earlier versions'
// decimal forms are still read (see parseBucket, parseFixed,
// parseSliding).
//
// An override, "<prefix>{key}:o" (encodeOverride, decodeOverride;
// parseOverride in prelude.lua): "fg1", then "@<µs>" when it expires (on
// the decisions' time line; Lua adds it), then ";kind,quota,rate,period,alg"
// per limit, then optionally a newline and the limits' names as JSON,
// which only Go reads.
//
// # Errors
//
// A script's own errors are messages that start with errorPrefix,
// "FLOODGATE ": a Redis error reply (bucketOne), an error string in
// decide.lua's array, or a recordError. wrap turns them into
// floodgate.ErrStore, "redis: " and the rest of the message. The family:
//
//	FLOODGATE corrupt state: key K does not hold floodgate data
//	FLOODGATE wrong type: key K holds a value that is not floodgate state
//	FLOODGATE unknown limit kind X
//	FLOODGATE sliding log limit Q is over the maximum MAXLOG on key K;
//	          replace or delete its override
//	FLOODGATE invalid override RAW   (an override item's value)
//	FLOODGATE invalid limits RAW     (a Rebase's "<" limits)
//	FLOODGATE overridden             (a Rebase on a key with an override:
//	                                 overriddenReply, which skips the key)
//
// TestLuaErrorsArePrefixed holds every error_reply of the Lua to the
// prefix.
//
// Redis's own errors (OOM, BUSY) and a lost connection fail the whole
// call: each of its requests with floodgate.ErrStore (wrap).

// errorPrefix starts every error message of the scripts (see Errors).
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

// The first letters of a group's mark in a call of bucketBatch: a group
// that is not all or nothing ("g<count>"), one that is ("G<count>"), and
// one that is with advisory requests ("H<count>", then an argument of
// count bytes, '1' for an advisory request and '0' for another).
const (
	groupMark        = "g"
	groupAllMark     = "G"
	groupFlaggedMark = "H"
)

// keyMapMark is the first byte of the argument that maps a batch's
// requests to their keys (bucketBatch's last, see distinctKeys): no
// request's argument starts so (its first double, now, is -1 or an
// integer below 2^53), nor does a group's mark.
const keyMapMark = 'k'

// keyMapMax is the most requests a key map counts (2 bytes), and the
// longest run an argument map counts.
const keyMapMax = 1<<16 - 1

// argMapMark is the first byte of the argument that says how many times
// each of a batch's arguments stands (bucketBatch's last, see argRuns):
// no request's argument starts so, nor does a group's mark, nor
// keyMapMark.
const argMapMark = 'a'

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
		"SUFFIXES":      "'" + string(suffixes) + "'",
		"GROUP":         "'" + groupMark + "'",
		"GROUP_ALL":     "'" + groupAllMark + "'",
		"GROUP_FLAGGED": "'" + groupFlaggedMark + "'",
		"KEY_MAP":       strconv.Itoa(keyMapMark),
		"ARG_MAP":       strconv.Itoa(argMapMark),
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
		"CROSS_DECIDED":    crossDecided,
		"CROSS_REFUSED":    crossRefused,
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
