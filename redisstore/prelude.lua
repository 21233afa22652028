-- floodgate: what decide.lua and bucket.lua share. The Go code prepends
-- this file to each of them, so each script is one chunk for EVALSHA, and
-- to bucket.lua wrapped in a function for the Redis function library
-- (FUNCTION LOAD, FCALL), whose chunk runs once, at load time.
-- Every number stays below 2^53, so Lua's doubles hold it exactly.
-- A name in double braces is one of Go's constants, which Go writes in
-- when it assembles the scripts (luaConstants in protocol.go): Lua keeps
-- no copy of them.
--
-- Keys: every key the scripts name in a command is one of the call's keys,
-- the list that the entry functions (bucketOne, bucketBatch, decideBatch)
-- take: KEYS, declared, on a standalone server, Sentinel and a Cluster's
-- one-slot calls. The Lua builds no key: the client computes the derived
-- ones (a key's override key, the states that markOverridden marks, an
-- override's limits' keys) and passes them; an override's limits' keys,
-- which only the override says, are looked up among them (undeclared in
-- decide.lua), and a key not there sends the request back to the client
-- to declare it. Nothing here reads KEYS itself, so a caller may pass the
-- list another way (as arguments, for a Cluster call across slots).
--
-- Lua 5.1 and 5.4: the code runs unchanged on both (Redis and Valkey run
-- 5.1, Dragonfly 5.4). It uses no global that only one of them has
-- (unpack is table.unpack's, 5.1's global), struct only (which both
-- provide), and keeps every number it returns or packs an integer below
-- 2^53, of either subtype; TestLua54 runs the pure functions on 5.4.

local TWO53 = 9007199254740992
-- MAXSKEW is core's MaxPeriod in µs: the most a key's time line may run
-- ahead of the clock, and the most debt (in time) a bucket keeps.
local MAXSKEW = {{MAXSKEW}}
-- MAXDEBT is core's maxDebt: the most a window's forced count reaches.
local MAXDEBT = {{MAXDEBT}}
-- What a step does with its cost, core's mode: take it if the limits
-- allow, charge it whatever they say (Spec.Charge), or give it back
-- (Spec.Refund).
local TAKE, CHARGE, REFUND = 0, 1, 2
-- The kinds of limit, core.Kind: a spec's and an override's kind. Limit
-- i's state is in the key that ends in i and its kind's letter, the
-- kind's in SUFFIXES (suffixOf in redisstore.go).
local BUCKET, FIXED, SLIDING, LOG = {{BUCKET}}, {{FIXED}}, {{SLIDING}}, {{LOG}}
local SUFFIXES = {{SUFFIXES}}
-- Globals read once: a global is a table lookup at every use. A library
-- is loaded where only the redis table exists, so init binds them at the
-- first call (a script calls it first thing).
-- toint is 5.4's math.tointeger, nil on 5.1, whose numbers are all
-- doubles (see integers in decide.lua).
local floor, max, min, format, match, gmatch, sub, byte, concat, tonumber, type, sunpack, spack, call, rpcall, unpack, toint
local function init()
  floor, max, min, format, match, gmatch, sub, byte, concat = math.floor, math.max, math.min, string.format, string.match, string.gmatch, string.sub, string.byte, table.concat
  tonumber, type, sunpack, spack, call, rpcall = _G.tonumber, _G.type, struct.unpack, struct.pack, redis.call, redis.pcall
  unpack, toint = table.unpack or _G.unpack, math.tointeger -- 5.4's, or 5.1's global
end

-- FLOOR: for x >= 0, floor(x) is written x - x % 1, which is exactly
-- math.floor(x) (x % 1 is x - floor(x), x's fraction, which a double
-- holds exactly), where the decisions of the fast path run it: an
-- operator, where math.floor is a call of a C function, several times
-- per decision.

-- mulDiv is core.MulDiv: floor(a*b/c) and remainder, exactly, for
-- 0 <= a, b and 0 < c < 2^52.
local function mulDiv(a, b, c)
  -- A double's product: 5.4's integers (tonumber's) would wrap past 2^63
  -- where a double only rounds past 2^53, which the branch below handles.
  local p = (a + 0.0) * b
  if p < TWO53 then
    local q = p / c
    q = q - q % 1 -- floor(q), for q >= 0 (see FLOOR)
    local r = p - q * c
    if r < 0 then q = q - 1; r = r + c elseif r >= c then q = q + 1; r = r - c end
    return q, r
  end
  local bq = floor(b / c)
  local br = b - bq * c
  if br < 0 then bq = bq - 1; br = br + c elseif br >= c then bq = bq + 1; br = br - c end
  local bits, x = {}, a
  while x > 0 do
    local bit = x % 2
    bits[#bits + 1] = bit
    x = (x - bit) / 2
  end
  local q, r = 0, 0
  for i = #bits, 1, -1 do
    q, r = q * 2, r * 2
    if r >= c then q = q + 1; r = r - c end
    if bits[i] == 1 then
      r = r + br
      if r >= c then q = q + 1; r = r - c end
    end
  end
  return a * bq + q, r
end

-- stepBucket is core's stepBucket (core/algo.go): the GCRA step of the
-- token bucket, leaky bucket and GCRA, in the same steps with the same
-- names. The key's TAT is tat + f/R, written
-- at rate sr (0 for a missing key); tau = tauQ + tauR/R is the tolerance
-- and n*T = iq + ir/R the request's cost in time; mode says whether to
-- take it, charge it whatever the limit says (core's Spec.Charge) or give
-- it back (Spec.Refund). It returns whether the request passes, the TAT to store if it does (tat, f), and remaining,
-- retry (-1 never) and reset.
local function stepBucket(tat, f, sr, now, n, L, R, P, tauQ, tauR, iq, ir, mode)
  if sr ~= R then
    -- The rate changed: the fraction is in other units; round up, drop it.
    if f > 0 then tat = tat + 1 end
    f = 0
  end
  if tat < now then tat, f = now, 0 end
  local allowed, remaining, retry, reset = false, 0, 0, 0
  local force = mode == CHARGE
  if mode == REFUND then
    -- TAT moves back by n*T, but not before now: full stays full.
    local rq, rr = mulDiv(n, P, R)
    local nt, nf = tat - rq, f - rr
    if nf < 0 then nt, nf = nt - 1, nf + R end
    if nt < now then nt, nf = now, 0 end
    allowed = true
    tat, f = nt, nf
  elseif n > L then
    retry = -1
  else
    local nt, nf = tat + iq, f + ir
    if nf >= R then nt, nf = nt + 1, nf - R end
    local lt, lf = now + tauQ, tauR
    if force and nt > now + MAXSKEW then
      nt, nf = now + MAXSKEW, 0 -- the most debt a key keeps
    end
    if force or nt < lt or (nt == lt and nf <= lf) then
      allowed = true
      tat, f = nt, nf
    else
      local dt, df = nt - lt, nf - lf
      if df < 0 then dt, df = dt - 1, df + R end
      retry = dt
      if df > 0 then retry = retry + 1 end
    end
  end
  local dt, df = now + tauQ - tat, tauR - f
  if df < 0 then dt, df = dt - 1, df + R end
  if dt >= 0 then
    local q, r = mulDiv(dt, R, P)
    local x = (r + df) / P
    remaining = q + (x - x % 1) -- floor(x) (see FLOOR)
  end
  if tat > now or (tat == now and f > 0) then
    reset = tat - now
    if f > 0 then reset = reset + 1 end
  end
  return allowed, tat, f, remaining, retry, reset
end

local function fmt(x) return format('%d', x) end

-- timeMicros reads the server's clock, TIME, in µs. TIME answers two
-- decimal strings, seconds and microseconds. The seconds, which change
-- once a second, are kept with the string they were read from (Lua holds
-- equal strings as one, so comparing them compares two pointers), since
-- tonumber (C's strtod) is dear next to a lone decision. In a script, whose chunk runs
-- at every call, they are read each time.
local timeSecText, timeSec = false, 0
local function timeMicros()
  local t = call('TIME')
  local sec = t[1]
  if sec ~= timeSecText then timeSec, timeSecText = tonumber(sec), sec end
  return timeSec * 1000000 + tonumber(t[2])
end
local function fmt5(a, b, c, d, e) return format('%d:%d:%d:%d:%d', a, b, c, d, e) end


-- timeline is core's Spec.timeline: the time t at which a key's state is
-- read for a request at now, and the key's skew with it. last is the
-- time of the key's latest charge and skew how far its time line runs
-- ahead of the clock (see core.Step).
local function timeline(now, last, skew)
  local t = now + skew
  if t < last then
    skew = min(last - now, MAXSKEW)
    t = now + skew
  end
  return t, skew
end

-- A bucket's state is binary: a byte, then three big-endian doubles, tat,
-- d and e (struct '>Bddd'), or, when the TAT has a fraction f/R of a µs (a
-- rate that does not divide its period evenly) or the key runs ahead of
-- the clock, six, tat, d, e, f, R, skew ('>Bdddddd'): the TAT in µs, the
-- latest charge at tat - d, the skew, and e, the time (µs, on the
-- server's clock) until which the key's expiry is known to hold, or 0
-- (see bucketExpiry in bucket.lua). The byte says which form, and whether
-- the key may have an override: 1 and 2 (short, long) say it has none, so
-- that the fast path need not look; 3 and 4 that it may. Binary, because
-- parsing the numbers in decimal is dear in Redis. parseBucket returns tat, f, R,
-- last, skew, e and whether the key has no override (f, R and skew 0 in
-- the short form), or nil for anything else (an error reply that GET
-- returned too). It also reads the decimal
-- forms of earlier versions, with e 0 and an override possible: "tat:d"
-- and "tat:d:f:R:skew", and before those "tat" and "tat:f:R", which did
-- not keep their latest charge (last = 0: no step back is seen on them).
-- fmtBucket writes the shorter binary form that holds.
-- Every write of an override marks its key's bucket (see carry in
-- decide.lua); decide.lua, which does not look, writes 3 or 4; the fast
-- path writes 1 or 2 when it looked and found none.
local function parseBucket(raw)
  local n = #raw
  if n == 25 then
    local tag, x, d, e = sunpack('>Bddd', raw)
    if tag == 1 or tag == 3 then
      if x >= 0 and x < TWO53 and x % 1 == 0 and d >= 0 and d < TWO53 and d % 1 == 0 and
        e >= 0 and e < TWO53 and e % 1 == 0 then
        return x, 0, 0, x - d, 0, e, tag == 1
      end
      return nil
    end
  elseif n == 49 then
    local tag, x, d, e, y, z, k = sunpack('>Bdddddd', raw)
    if tag == 2 or tag == 4 then
      for _, v in ipairs({x, d, e, y, z, k}) do
        if not (v >= 0 and v < TWO53 and v % 1 == 0) then return nil end
      end
      return x, y, z, x - d, k, e, tag == 2
    end
  end
  if type(raw) ~= 'string' then return nil end -- an error reply
  local x, d = match(raw, '^(%d+):(%d+)$')
  if x then
    x = tonumber(x)
    return x, 0, 0, x - tonumber(d), 0, 0, false
  end
  local y, z, k
  x, d, y, z, k = match(raw, '^(%d+):(%d+):(%d+):(%d+):(%d+)$')
  if x then
    x = tonumber(x)
    return x, tonumber(y), tonumber(z), x - tonumber(d), tonumber(k), 0, false
  end
  if match(raw, '^%d+$') then return tonumber(raw), 0, 0, 0, 0, 0, false end
  x, y, z = match(raw, '^(%d+):(%d+):(%d+)$')
  if x then return tonumber(x), tonumber(y), tonumber(z), 0, 0, 0, false end
end

-- fmtBucket's bare says the key has no override.
local function fmtBucket(tat, f, R, last, skew, e, bare)
  if f == 0 and skew == 0 then return spack('>Bddd', bare and 1 or 3, tat, tat - last, e) end
  return spack('>Bdddddd', bare and 2 or 4, tat, tat - last, e, f, R, skew)
end

-- decideBucket is core's Spec.Step for a bucket: it reads the state at
-- the key's time line (rejoining the clock from a fresh state when the
-- bucket is full by the clock too, as core's rejoin) and steps it. It
-- returns stepBucket's results, then the time t the state was read at
-- and the key's skew.
local function decideBucket(tat, f, sr, last, skew, now, n, L, R, P, tauQ, tauR, iq, ir, mode)
  local t, sk = now, 0
  if skew ~= 0 or now < last then t, sk = timeline(now, last, skew) end -- rare: a call saved
  if sk ~= 0 then
    local e = tat
    if f > 0 then e = e + 1 end
    if e - sk <= now then t, sk, tat, f, sr = now, 0, 0, 0, 0 end
  end
  local allowed, nt, nf, remaining, retry, reset = stepBucket(tat, f, sr, t, n, L, R, P, tauQ, tauR, iq, ir, mode)
  return allowed, nt, nf, remaining, retry, reset, t, sk
end

-- A fixed window's state is binary too, once floodgate writes it: a byte,
-- then five big-endian doubles, the window's start and end (µs), its
-- count, the latest charge and the skew (struct '>Bddddd'). The byte is 5
-- when the key has no override, so that the fast path need not look, and
-- 6 when it may, as for a bucket: decide.lua writes 6, the fast path 5
-- when it looked and found none, and every write of an override marks the
-- key's window. parseFixed returns start, end, count, last, skew and
-- whether the key has no override, or nil for anything else (an error
-- reply too); it also
-- reads the decimal forms of earlier versions, "start:end:count:last:skew"
-- and "start:end:count", which may have an override.
local function parseFixed(raw)
  if #raw == 41 then
    local tag, x, y, z, l, k = sunpack('>Bddddd', raw)
    if tag == 5 or tag == 6 then
      if x > -TWO53 and x < TWO53 and x % 1 == 0 and y > -TWO53 and y < TWO53 and y % 1 == 0 and
        z >= 0 and z < TWO53 and z % 1 == 0 and l >= 0 and l < TWO53 and l % 1 == 0 and
        k >= 0 and k < TWO53 and k % 1 == 0 then
        return x, y, z, l, k, tag == 5
      end
      return nil
    end
  end
  if type(raw) ~= 'string' then return nil end -- an error reply
  local x, y, z, l, k = match(raw, '^(%-?%d+):(%-?%d+):(%d+):(%d+):(%d+)$')
  if x then return tonumber(x), tonumber(y), tonumber(z), tonumber(l), tonumber(k), false end
  x, y, z = match(raw, '^(%-?%d+):(%-?%d+):(%d+)$')
  if x then return tonumber(x), tonumber(y), tonumber(z), 0, 0, false end
end

-- fmtFixed's bare says the key has no override.
local function fmtFixed(s, se, count, last, skew, bare)
  return spack('>Bddddd', bare and 5 or 6, s, se, count, last, skew)
end

-- MARKS is what markOverridden does: for the state of each kind that
-- the fast path decides, the first byte that marks each unmarked form, by
-- its tag and length.
local MARKS = {{['1:25'] = '\3', ['2:49'] = '\4'}, {['5:41'] = '\6'}}

-- markOverridden marks the fast path's states of a key, its limit 0's
-- bucket at bkey and fixed window at fkey ("<prefix>{key}:0b" and "…:0f",
-- which the client declares), as ones that may have an override (see
-- parseBucket and parseFixed), keeping their values and expiries
-- otherwise.
local function markOverridden(bkey, fkey)
  for i, key in ipairs({bkey, fkey}) do
    local raw = rpcall('GET', key)
    if type(raw) == 'string' then
      local to = MARKS[i][byte(raw) .. ':' .. #raw]
      if to then call('SETRANGE', key, '0', to) end
    end
  end
end

-- windowOf is core's Spec.Window: the fixed window [start, end) of
-- period P that contains t, epoch-aligned, or for a calendar window
-- (c1 > 0) the one the client named, [c0, c1) or [c1, c2).
local function windowOf(P, c0, c1, c2, t)
  if c1 == 0 then
    local off = t % P
    return t - off, t - off + P
  end
  if t < c1 then return c0, c1 end
  return c1, c2
end

-- decideFixed is core's Spec.Step for a fixed window counter, whose state
-- (found, or not and zeros) is its window [s, se), its count, the latest
-- charge and the skew. A window that starts after now (the clock went
-- back) stays the current one, as in Go; its end is stored because a
-- calendar window's end cannot be computed here. The key reads at its
-- time line t (see timeline), and rejoins the clock when its window ended
-- before the clock's began, as core's rejoin. It returns allowed,
-- remaining, retry (-1 never) and reset, then the state to write if the
-- request is charged (start, end, count, t, skew) and how long beyond its
-- reset the key is to be kept (core's Spec.Hold).
local function decideFixed(found, s, se, count, last, skew, now, n, L, P, c0, c1, c2, mode)
  local t, sk = now, 0
  if c1 == 0 and (skew ~= 0 or now < last) then t, sk = timeline(now, last, skew) end -- a calendar window keeps no skew
  local fresh = false
  if sk ~= 0 and se - sk <= windowOf(P, c0, c1, c2, now) then
    t, sk, fresh = now, 0, true
  end
  local start, stop
  if c1 == 0 and found and not fresh then
    -- core's l.Window(max(t, s)): the stored end is only needed for a
    -- calendar window, and may be another limit's (an override's).
    start, stop = windowOf(P, c0, c1, c2, max(t, s))
  elseif found and not fresh and s >= t then
    start, stop = s, se
  else
    start, stop = windowOf(P, c0, c1, c2, t)
  end
  if fresh or s ~= start then count = 0 end
  local allowed, retry, reset = false, 0, 0
  if mode == REFUND then
    allowed = true
    count = max(count - n, 0)
  elseif n > L then
    retry = -1
  elseif mode == CHARGE or count + n <= L then
    allowed = true
    count = min(count + n, MAXDEBT)
  else
    retry = stop - t
  end
  local hold = 0
  if sk > 0 then hold = P end
  if count > 0 then reset = stop - t end
  return allowed, max(L - count, 0), retry, reset, start, stop, count, t, sk, hold
end

local function corrupt(key)
  return redis.error_reply('FLOODGATE corrupt state: key ' .. key .. ' does not hold floodgate data')
end

local function wrongType(key)
  return redis.error_reply('FLOODGATE wrong type: key ' .. key .. ' holds a value that is not floodgate state')
end

-- readError returns the error reply for a read of key that failed with
-- Redis's error e: "wrong type" for WRONGTYPE, and otherwise Redis's own
-- words (an ACL's refusal), which the client must not take for bad data.
local function readError(key, e)
  e = tostring(e)
  if sub(e, 1, 9) == 'WRONGTYPE' then return wrongType(key) end
  return redis.error_reply(e)
end

-- Overrides (see override.go): a key's own limits, in the Redis key that
-- ends in ":o" beside its limits' states, "<prefix>{key}:o", which the
-- client declares with each request. Its value is
-- "fg1", "@" and when it expires (µs, on the time line of the decisions,
-- which Redis's own expiry backs) if it does, then
-- ";kind,quota,rate,period,alg" per limit, then a newline and
-- what only the client reads (the limits' names). Limit i of an override
-- keeps its state in "<prefix>{key}:<i-1><kind letter>", as the client
-- names a Policy's keys.

-- argKeys splits the arguments of a call that passes its keys as
-- arguments (the functions <library>_buckets_argkeys and _decide_argkeys,
-- for a Cluster call across slots, see protocol.go): the number of keys
-- m, the m keys, then the arguments. It returns the keys and the
-- arguments, as the entry functions take them.
local function argKeys(args)
  local m = tonumber(args[1])
  local keys, rest = {}, {}
  for i = 1, m do keys[i] = args[i + 1] end
  for i = m + 2, #args do rest[i - m - 1] = args[i] end
  return keys, rest
end

-- parseOverride returns the limits of the override raw, as readSpec
-- builds them, and, given the override's key okey, the names of their
-- keys beside it: names to look up among the call's keys (see undeclared
-- in decide.lua), not to use unless found there; nil if raw is not an
-- override. The fast path, which decides an override only on the
-- request's own key, passes no okey.
local function parseOverride(raw, okey)
  local head = match(raw, '^fg1([^\n]*)')
  if not head then return nil end
  local expires = match(head, '^@(%d+)')
  if expires then head = sub(head, #expires + 2); expires = tonumber(expires) end
  local base = okey and sub(okey, 1, -2)
  local specs, keys = {}, {}
  for k, q, r, p in gmatch(head, ';(%d+),(%d+),(%d+),(%d+),%d+') do
    k, q, r, p = tonumber(k), tonumber(q), tonumber(r), tonumber(p)
    local sp = {kind = k, quota = q, rate = r, period = p, tauQ = 0, tauR = 0, tq = 0, tr = 0, c0 = 0, c1 = 0, c2 = 0}
    if k == BUCKET then
      sp.tq, sp.tr = mulDiv(1, p, r)
      sp.tauQ, sp.tauR = mulDiv(q, p, r)
    end
    if k < BUCKET or k > LOG or q < 1 or r < 1 or p < 1 then return nil end
    if base then keys[#specs + 1] = base .. (#specs) .. sub(SUFFIXES, k, k) end -- suffixOf
    specs[#specs + 1] = sp
  end
  if #specs == 0 then return nil end
  return {raw = raw, specs = specs, keys = keys, expires = expires}
end
