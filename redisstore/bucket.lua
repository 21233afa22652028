-- floodgate: the fast path for the commonest decisions, one request
-- against one bucket limit (token bucket, leaky bucket, GCRA) or one fixed
-- window (epoch-aligned: not a calendar window). It decides with the same
-- decideBucket and decideFixed (prelude.lua) as decide.lua, and reads and
-- writes the same states (see parseBucket and parseFixed); the
-- conformance suite and the differential fuzz test run through it. It
-- exists because a lone decision costs Redis about a third of the
-- instructions that decide.lua's general batch machinery does, and that
-- is the latency of a single caller. Batches of such decisions go through
-- it too (bucketBatch): one call, and for each decision its two reads and
-- one write.
-- (prelude.lua comes first. As a script, init() is called before this
-- code; in the library, these are functions of the library.)
--
-- A decision's reply is a record, read by bucketRecord (fastpath.go): a
-- byte that says which kind, then for a decision allowed (0/1), remaining,
-- retry (µs, -1 never) and reset (µs) as four big-endian doubles, and for
-- an override or an error message its length (4 bytes, big-endian) and its
-- bytes. Binary, because Redis turns an array of numbers into its reply,
-- and the client back, at a cost per number that a string does not have;
-- a batch's reply is its records one after the other, one string.
local RECORD_DECISION = 0 -- a decision
local RECORD_OVERRIDE = 1 -- a decision by the key's override, and the override
local RECORD_ELSEWHERE = 2 -- the key's override alone: decide.lua decides it
local RECORD_ERROR = 3 -- the decision's error message (in a batch)

-- WINDOW_ARG is the length of a fixed window's argument (windowArgLen in
-- fastpath.go); a bucket's is 80, and a group's mark is shorter.
local WINDOW_ARG = 40

-- bucketExpiry says how a bucket's key charged at now (µs, the server's
-- clock) stays until ttl ms from now, when its limit is full again, given
-- e from its state. While e covers that, the key keeps its expiry (false,
-- e): setting one costs Redis as much again as writing the value.
-- Otherwise it returns the expiry to set, ttl and a slack of a quarter of
-- it but at least a second, so that a key charged often sets one about
-- once a second, and its e, 1ms short of it for Redis's rounding to the
-- millisecond. A key so outlives its full limit by at most the slack.
local function bucketExpiry(e, now, ttl)
  if now + ttl * 1000 <= e then return false, e end
  local px = ttl + max(1000, floor(ttl / 4))
  return px, now + (px - 1) * 1000
end

-- record returns a decision's record, with the key's override oraw after
-- it when there is one (false for none).
local function record(oraw, allowed, remaining, retry, reset)
  if oraw then
    return spack('>BddddI4', RECORD_OVERRIDE, allowed and 1 or 0, remaining, retry, reset, #oraw) .. oraw
  end
  return spack('>Bdddd', RECORD_DECISION, allowed and 1 or 0, remaining, retry, reset)
end

-- elsewhere returns the record that hands a request to decide.lua: the
-- key's override alone.
local function elsewhere(s)
  return spack('>BI4', RECORD_ELSEWHERE, #s.oraw) .. s.oraw
end

-- readOverride reads the override of the key whose state is key into
-- s.ov (parsed) and s.oraw (as stored), and returns nothing, or an error
-- reply.
local function readOverride(key, s)
  local okey = sub(key, 1, -3) .. 'o'
  local oraw = rpcall('GET', okey)
  if type(oraw) == 'table' and oraw.err then return wrongType(okey) end
  if oraw then
    s.ov, s.oraw = parseOverride(oraw, key), oraw
    if not s.ov then return corrupt(okey) end
  end
end

-- A call's state tables are reused by the calls after it: building a
-- table of a dozen fields was a twentieth of a bucket decision's
-- instructions in Redis (callgrind, batches of 16). In the library, whose
-- locals outlive a call, each kind keeps up to POOL_MAX tables; a call
-- takes them in order from the first (bucketOne and bucketBatch start it
-- over) and newBucket and newWindow set every field of each, so nothing of
-- an earlier call remains: the state's numbers to zero for a key that
-- holds none, and otherwise not at all, since the caller's parse sets
-- every one of them (or nil, when it fails, and the table is dropped).
-- (A script's chunk runs at every call, and starts with empty pools.)
local POOL_MAX = 256
local bucketPool, windowPool, nBuckets, nWindows = {}, {}, 0, 0

-- newBucket returns a bucket's state as this call starts it, from raw,
-- what GET read of the key (false when it holds none), which the caller
-- then parses into it.
local function newBucket(raw)
  local found = raw and true
  nBuckets = nBuckets + 1
  local s = bucketPool[nBuckets]
  if s then
    s.ov, s.oraw, s.found, s.ttl, s.dirty = false, false, found, false, false
    if not found then s.tat, s.f, s.sr, s.last, s.skew, s.e = 0, 0, 0, 0, 0, 0 end
    return s
  end
  -- Every field in the constructor, so that the table is sized once.
  s = {ov = false, oraw = false, found = found, tat = 0, f = 0, sr = 0, last = 0, skew = 0, e = 0, ttl = false, dirty = false}
  if nBuckets <= POOL_MAX then bucketPool[nBuckets] = s end
  return s
end

-- newWindow is newBucket for a fixed window's state.
local function newWindow(raw)
  local found = raw and true
  nWindows = nWindows + 1
  local s = windowPool[nWindows]
  if s then
    s.ov, s.oraw, s.found, s.ttl, s.dirty = false, false, found, false, false
    if not found then s.start, s.stop, s.count, s.last, s.skew = 0, 0, 0, 0, 0 end
    return s
  end
  s = {ov = false, oraw = false, found = found, start = 0, stop = 0, count = 0, last = 0, skew = 0, ttl = false, dirty = false, window = true}
  if nWindows <= POOL_MAX then windowPool[nWindows] = s end
  return s
end

-- loadState returns the state of the bucket (kind 1) or fixed window
-- (kind 2) at key as this call has it (see seen, below), reading it at the
-- key's first decision of the call, with the key's override when the
-- state does not say it has none; or nil and an error reply.
local function loadState(key, seen, kind)
  local s = seen[key]
  if s then return s end
  local raw = rpcall('GET', key)
  if type(raw) == 'table' and raw.err then return nil, wrongType(key) end
  local bare = false
  if kind == 1 then
    s = newBucket(raw)
    if raw then
      s.tat, s.f, s.sr, s.last, s.skew, s.e, bare = parseBucket(raw)
      if not s.tat then return nil, corrupt(key) end
    end
  else
    s = newWindow(raw)
    if raw then
      s.start, s.stop, s.count, s.last, s.skew, bare = parseFixed(raw)
      if not s.start then return nil, corrupt(key) end
    end
  end
  if not bare then
    -- The key may have an override (see parseBucket, parseFixed): look.
    local err = readOverride(key, s)
    if err then return nil, err end
  end
  seen[key] = s
  return s
end

-- liveOverride returns the override of the key whose state is s, false
-- for none (or an expired one) at now, and whether the fast path decides
-- with it: a lone limit of the kind (1 bucket, 2 fixed window; an
-- override's window is never a calendar one) is decided here, with its
-- parameters; other limits are decide.lua's, and the request's record
-- then holds the override alone, which tells the client to send the
-- request there.
local function liveOverride(s, now, kind)
  local ov = s.ov
  if not ov or (ov.expires and ov.expires <= now) then return false, true end
  return ov, #ov.specs == 1 and ov.specs[1].kind == kind
end

-- The argument that decideBucketKey unpacked last, and its ten numbers:
-- the requests of one Policy with one cost on the server's clock (now -1)
-- carry the same bytes, which Lua holds as one string, so each decision
-- after the first of them, in this call or a later one, compares two
-- pointers instead of unpacking (a thirtieth of a decision's instructions
-- in Redis). A script's chunk, run at every call, starts with none.
local bArg, bNow, bN, bExtra, bL, bR, bP, bTauQ, bTauR, bIq, bIr = false, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0

-- decideBucketKey decides one request on the bucket whose state is key.
-- arg is ten big-endian doubles (struct.pack '>dddddddddd'), which cost
-- Redis far less to read than ten decimal strings: now in µs (or -1 for
-- the server's TIME, which serverTime reads), the cost n (0 peeks),
-- milliseconds added to the expiry, quota, rate, period (µs), then tau and
-- n*T as quotient and remainder (tauQ, tauR, iq, ir), which the client
-- computes exactly.
-- seen holds, for one call, each key's override and state as read and as
-- decided since (see bucketFlush, which writes them): a key decided
-- several times in a batch is read once and written once, as decide.lua
-- does, and each decision sees the ones before it.
-- It returns the decision's record (see RECORD_DECISION), or an error
-- reply.
local function decideBucketKey(key, arg, serverTime, seen)
  if arg ~= bArg then
    bNow, bN, bExtra, bL, bR, bP, bTauQ, bTauR, bIq, bIr = sunpack('>dddddddddd', arg)
    bArg = arg
  end
  local now, n, extra, L, R, P, tauQ, tauR, iq, ir = bNow, bN, bExtra, bL, bR, bP, bTauQ, bTauR, bIq, bIr
  local onServer = now < 0
  if onServer then now = serverTime() end

  local s = seen[key]
  if not s then
    -- loadState's, written out: this is every lone decision's path, where
    -- a call costs.
    local raw = rpcall('GET', key)
    if type(raw) == 'table' and raw.err then return wrongType(key) end
    s = newBucket(raw)
    local bare = false
    if raw then
      s.tat, s.f, s.sr, s.last, s.skew, s.e, bare = parseBucket(raw)
      if not s.tat then return corrupt(key) end
    end
    if not bare then
      local err = readOverride(key, s)
      if err then return err end
    end
    seen[key] = s
  end

  -- The key's override, if it has one (see liveOverride).
  local ov, here = s.ov, true
  if ov then ov, here = liveOverride(s, now, 1) end
  if not here then return elsewhere(s) end
  if ov then
    local sp = ov.specs[1]
    L, R, P, tauQ, tauR = sp.quota, sp.rate, sp.period, sp.tauQ, sp.tauR
    iq, ir = sp.tq, sp.tr
    if n ~= 1 and n <= L then iq, ir = mulDiv(n, P, R) end
  end

  local allowed, nt, nf, remaining, retry, reset, t, sk = decideBucket(s.tat, s.f, s.sr, s.last, s.skew, now, n, L, R, P, tauQ, tauR, iq, ir, TAKE)
  if n == 0 then allowed, retry = true, 0 end

  if allowed and n > 0 then
    local ttl = floor((reset + 999) / 1000) + extra
    if ttl < 1 then ttl = 1 end
    if onServer then
      -- On the server's clock, whose time Redis's expiry keeps, the key
      -- keeps an expiry that still covers this charge (bucketExpiry). An
      -- expiry set earlier in this call stays to be written.
      local px, e = bucketExpiry(s.e, now, ttl)
      if px then s.ttl = px end
      s.e = e
    else
      s.ttl, s.e = ttl, 0
    end
    s.tat, s.f, s.sr, s.last, s.skew, s.found = nt, nf, R, t, sk, true
    if not s.dirty then s.dirty = true; seen[#seen + 1] = key end
  elseif s.found and sk > s.skew then
    -- The clock stepped back: remember it, as core's Commit does.
    s.skew = sk
    if not s.dirty then s.dirty = true; seen[#seen + 1] = key end
  end
  if ov then return record(s.oraw, allowed, remaining, retry, reset) end
  return spack('>Bdddd', RECORD_DECISION, allowed and 1 or 0, remaining, retry, reset)
end

-- The argument that decideWindowKey unpacked last, and its five numbers,
-- as for a bucket (bArg).
local wArg, wNow, wN, wExtra, wL, wP = false, 0, 0, 0, 0, 0

-- decideWindowKey decides one request on the fixed window whose state is
-- key, as decideBucketKey does on a bucket. arg is five big-endian
-- doubles (struct.pack '>ddddd'): now in µs (or -1 for the server's TIME),
-- the cost n (0 peeks; -n charges n whatever the limit says, as core's
-- Spec.Charge), milliseconds added to the expiry, quota and period (µs).
local function decideWindowKey(key, arg, serverTime, seen)
  if arg ~= wArg then
    wNow, wN, wExtra, wL, wP = sunpack('>ddddd', arg)
    wArg = arg
  end
  local now, n, extra, L, P = wNow, wN, wExtra, wL, wP
  local onServer = now < 0
  if onServer then now = serverTime() end
  local mode = TAKE
  if n < 0 then mode, n = CHARGE, -n end

  local s = seen[key]
  if not s then
    local err
    s, err = loadState(key, seen, 2)
    if not s then return err end
  end

  -- The key's override, if it has one (see liveOverride).
  local ov, here = s.ov, true
  if ov then ov, here = liveOverride(s, now, 2) end
  if not here then return elsewhere(s) end
  if ov then L, P = ov.specs[1].quota, ov.specs[1].period end
  if mode == CHARGE then n = min(n, L) end -- at most the quota, as core's Charge

  local allowed, remaining, retry, reset, start, stop, count, t, sk, hold = decideFixed(s.found, s.start, s.stop,
    s.count, s.last, s.skew, now, n, L, P, 0, 0, 0, mode)
  if n == 0 then allowed, retry = true, 0 end

  if allowed and n > 0 then
    local ttl = floor((reset + hold + 999) / 1000) + extra
    if ttl < 1 then ttl = 1 end
    if not onServer then
      s.ttl = ttl
    elseif not (s.found and s.start == start and s.stop == stop and sk == 0 and s.skew == 0) then
      -- On the server's clock a window's key outlives it by a slack, a
      -- quarter of it but at least a second, as a bucket's does (see
      -- bucketExpiry): a client's next request, often in the next
      -- window, then finds a state that says whether the key has an
      -- override, where a missing key makes it look. A charge in a window
      -- whose expiry (at least its end) was set when it began keeps it.
      s.ttl = ttl + max(1000, floor(ttl / 4))
    end
    s.start, s.stop, s.count, s.last, s.skew, s.found = start, stop, count, t, sk, true
    if not s.dirty then s.dirty = true; seen[#seen + 1] = key end
  elseif s.found and sk > s.skew then
    s.skew = sk -- the clock stepped back, as for a bucket
    if not s.dirty then s.dirty = true; seen[#seen + 1] = key end
  end
  if ov then return record(s.oraw, allowed, remaining, retry, reset) end
  return spack('>Bdddd', RECORD_DECISION, allowed and 1 or 0, remaining, retry, reset)
end

-- decideFastKey decides one request of the fast path: a fixed window's
-- or a bucket's, by the length of its argument.
local function decideFastKey(key, arg, serverTime, seen)
  if #arg == WINDOW_ARG then return decideWindowKey(key, arg, serverTime, seen) end
  return decideBucketKey(key, arg, serverTime, seen)
end

-- bucketFlush writes the states that decideFastKey changed, once each,
-- in the order they were first changed: with the expiry that the call's
-- charges need, or keeping the key's own when it covers them (see
-- bucketExpiry) or only the key's skew moved.
local function bucketFlush(seen)
  for i = 1, #seen do
    local key = seen[i]
    local s = seen[key]
    local v
    if s.window then
      v = fmtFixed(s.start, s.stop, s.count, s.last, s.skew, not s.oraw)
    else
      v = fmtBucket(s.tat, s.f, s.sr, s.last, s.skew, s.e, not s.oraw)
    end
    -- fmt: Redis would format a number argument with %.17g, which costs more.
    if s.ttl then call('SET', key, v, 'PX', fmt(s.ttl)) else call('SET', key, v, 'KEEPTTL') end
  end
end

-- bucketTime returns a function that reads the server's TIME at its first
-- call and returns the same µs at every later one: the decisions of one
-- call are made at one instant, as decide.lua's are.
local function bucketTime()
  local now
  return function()
    if not now then now = timeMicros() end
    return now
  end
end

-- bucketOne decides one request on the bucket or fixed window whose state
-- is key: the fast path's function.
local function bucketOne(key, arg)
  nBuckets, nWindows = 0, 0
  local seen = {}
  local r = decideFastKey(key, arg, timeMicros, seen)
  bucketFlush(seen)
  return r
end

-- asRecord returns decideFastKey's answer r as a record: an error reply
-- becomes the record of its message.
local function asRecord(r)
  if type(r) == 'table' then return spack('>BI4', RECORD_ERROR, #r.err) .. r.err end
  return r
end

-- checkGroup loads the states of the count requests of a group whose keys
-- start at keys[k] and arguments at argv[a], and returns nothing when the
-- fast path decides them all, or the record that answers the whole group
-- instead: an error, or an override that is decide.lua's. So a group is
-- decided whole or not at all, as decide.lua decides it.
local function checkGroup(keys, argv, k, a, count, serverTime, seen)
  for j = 0, count - 1 do
    local key, arg = keys[k + j], argv[a + j]
    local kind = 1
    if #arg == WINDOW_ARG then kind = 2 end
    local s, err = loadState(key, seen, kind)
    if not s then return asRecord(err) end
    if s.ov then
      -- Only an override can send the group elsewhere (liveOverride).
      local now = sunpack('>d', arg)
      if now < 0 then now = serverTime() end
      local _, here = liveOverride(s, now, kind)
      if not here then return elsewhere(s) end
    end
  end
end

-- groupSizes remembers the size of each group mark ("g<count>") that
-- bucketBatch read, one entry per size: tonumber costs Lua about two
-- thousand instructions (C's strtod), looking up the interned mark a few
-- dozen. A script's chunk, run at every call, starts with none.
local groupSizes = {}

-- bucketBatch decides, in order, one request per key of KEYS, each on the
-- bucket or fixed window whose state is that key, with its argument in
-- ARGV (as decideFastKey's), or a group of requests: an argument "g<count>"
-- before the count requests' own, decided in order, one after the other,
-- as decide.lua decides a group that is not all or nothing. Each decision
-- sees the ones before it. It returns the requests' records, in order, as
-- one string: a decision that fails has the record of its error, and each
-- request of a group that the fast path does not decide the record that
-- says why (see checkGroup).
local function bucketBatch(keys, argv)
  nBuckets, nWindows = 0, 0
  local out, serverTime, seen = {}, bucketTime(), {}
  local k, a, m = 1, 1, 0 -- m records in out: # searches for the end
  while a <= #argv do
    local arg = argv[a]
    if #arg < WINDOW_ARG then -- "g<count>"
      local count = groupSizes[arg]
      if not count then
        count = tonumber(sub(arg, 2))
        groupSizes[arg] = count
      end
      local r = checkGroup(keys, argv, k, a + 1, count, serverTime, seen)
      for j = 0, count - 1 do
        m = m + 1
        out[m] = r or asRecord(decideFastKey(keys[k + j], argv[a + 1 + j], serverTime, seen))
      end
      k, a = k + count, a + 1 + count
    else
      -- decideFastKey's dispatch, written out: a lone decision's path.
      local r
      if #arg == WINDOW_ARG then
        r = decideWindowKey(keys[k], arg, serverTime, seen)
      else
        r = decideBucketKey(keys[k], arg, serverTime, seen)
      end
      if type(r) == 'table' then r = asRecord(r) end
      m = m + 1
      out[m] = r
      k, a = k + 1, a + 1
    end
  end
  bucketFlush(seen)
  return concat(out)
end
