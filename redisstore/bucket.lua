-- floodgate: the fast path for the commonest decisions, one request
-- against one bucket limit (token bucket, leaky bucket, GCRA) or one fixed
-- window (epoch-aligned: not a calendar window): a take, a window's
-- forced charge, or a bucket's refund (what a lease gives back). It
-- decides with the same decideBucket and decideFixed (prelude.lua) as
-- decide.lua, and reads and writes the same states (see parseBucket and
-- parseFixed); the conformance suite and the differential fuzz test run
-- through it. It exists because decide.lua's general batch machinery
-- costs Redis several times a lone decision's own work, and that is the
-- latency of a single caller. Batches of such decisions go through
-- it too (bucketBatch): one call, in which MGET reads most of the batch's
-- states (see bucketBatch), and each key is written once.
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
local RECORD_DECISION = {{RECORD_DECISION}} -- a decision
local RECORD_OVERRIDE = {{RECORD_OVERRIDE}} -- a decision by the key's override, and the override
local RECORD_ELSEWHERE = {{RECORD_ELSEWHERE}} -- the key's override alone: decide.lua decides it
local RECORD_ERROR = {{RECORD_ERROR}} -- the decision's error message (in a batch)

-- A request's argument says by its length what it decides: 40 bytes
-- (windowArgLen in protocol.go) a fixed window, 80 a bucket, and one more
-- byte than these a key that another request of the call names too (see
-- bucketBatch); a group's mark is shorter than all of them. WINDOW_ARG is
-- the shortest, BUCKET_ARG the shortest a bucket's.
local WINDOW_ARG, BUCKET_ARG = {{WINDOW_ARG}}, {{BUCKET_ARG}}
-- The first letter of a group's mark in a batch (see bucketBatch): a
-- group that is not all or nothing, one that is, and one that is whose
-- advisory requests' flags follow the mark.
local GROUP, GROUP_ALL, GROUP_FLAGGED = {{GROUP}}, {{GROUP_ALL}}, {{GROUP_FLAGGED}}

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
-- key's override alone, oraw.
local function elsewhere(oraw)
  return spack('>BI4', RECORD_ELSEWHERE, #oraw) .. oraw
end

-- readOverride reads the override at okey, a key's override key, and
-- returns it parsed and as stored (false, false for none), or nil, nil
-- and an error reply.
local function readOverride(okey)
  local oraw = rpcall('GET', okey)
  if type(oraw) == 'table' and oraw.err then return nil, nil, readError(okey, oraw.err) end
  if not oraw then return false, false end
  local ov = parseOverride(oraw)
  if not ov then return nil, nil, corrupt(okey) end
  return ov, oraw
end

-- A key that one request of a call names is decided with its state in
-- locals and written at once. A key that several name (which the client
-- says, see bucketBatch) keeps its state in a table for the call, in seen:
-- read once, and written once by bucketFlush, each decision seeing the
-- ones before it, as decide.lua does. Those tables are reused by the
-- calls after it, since building a table of a dozen fields is a visible
-- part of a decision's cost in Redis. In the library, whose locals outlive a call, each kind keeps up to
-- POOL_MAX tables; a call takes them in order from the first (bucketBatch
-- starts it over) and newBucket and newWindow set every field of each, so
-- nothing of an earlier call remains. (A script's chunk runs at every
-- call, and starts with empty pools.)
local POOL_MAX = 256
local bucketPool, windowPool, nBuckets, nWindows = {}, {}, 0, 0

-- newBucket returns a table that holds a bucket's state for the call: the
-- key's override (parsed and as stored, or false), the length of the
-- key's value (0 for none: found is whether it has one), and the state
-- (see parseBucket).
local function newBucket(ov, oraw, size, tat, f, sr, last, skew, e)
  nBuckets = nBuckets + 1
  local s = bucketPool[nBuckets]
  if s then
    s.ov, s.oraw, s.size, s.found, s.ttl, s.dirty = ov, oraw, size, size > 0, false, false
    s.tat, s.f, s.sr, s.last, s.skew, s.e = tat, f, sr, last, skew, e
    return s
  end
  -- Every field in the constructor, so that the table is sized once.
  s = {ov = ov, oraw = oraw, size = size, found = size > 0, tat = tat, f = f, sr = sr, last = last, skew = skew, e = e, ttl = false, dirty = false}
  if nBuckets <= POOL_MAX then bucketPool[nBuckets] = s end
  return s
end

-- newWindow is newBucket for a fixed window's state (see parseFixed).
local function newWindow(ov, oraw, size, start, stop, count, last, skew)
  nWindows = nWindows + 1
  local s = windowPool[nWindows]
  if s then
    s.ov, s.oraw, s.size, s.found, s.ttl, s.dirty = ov, oraw, size, size > 0, false, false
    s.start, s.stop, s.count, s.last, s.skew = start, stop, count, last, skew
    return s
  end
  s = {ov = ov, oraw = oraw, size = size, found = size > 0, start = start, stop = stop, count = count, last = last, skew = skew, ttl = false, dirty = false, window = true}
  if nWindows <= POOL_MAX then windowPool[nWindows] = s end
  return s
end

-- stateError returns the error reply for a key whose value raw (what GET
-- returned: a string, or an error reply) is no state of its kind.
local function stateError(key, raw)
  if type(raw) == 'table' then return readError(key, raw.err) end
  return corrupt(key)
end

-- readBucket reads the bucket's state at key, with the key's override
-- when the state does not say it has none, or takes raw, the key's value
-- as MGET read it (false or nil: GET reads it, and tells a missing key
-- from one of another type, which MGET does not; true: the key holds
-- nothing and has no override, see markAbsent): it returns the override
-- (parsed and as stored, or false), the length of the key's value (0 for
-- none), and the state (zeros for none); or nil and an error reply.
local function readBucket(key, okey, raw)
  if raw == true then return false, false, 0, 0, 0, 0, 0, 0, 0 end
  if not raw then raw = rpcall('GET', key) end
  if not raw then
    local ov, oraw, err = readOverride(okey)
    if err then return nil, err end
    return ov, oraw, 0, 0, 0, 0, 0, 0, 0
  end
  local tat, f, sr, last, skew, e, bare = parseBucket(raw)
  if not tat then return nil, stateError(key, raw) end
  if bare then return false, false, #raw, tat, f, sr, last, skew, e end
  local ov, oraw, err = readOverride(okey)
  if err then return nil, err end
  return ov, oraw, #raw, tat, f, sr, last, skew, e
end

-- readWindow is readBucket for a fixed window's state.
local function readWindow(key, okey, raw)
  if raw == true then return false, false, 0, 0, 0, 0, 0, 0 end
  if not raw then raw = rpcall('GET', key) end
  if not raw then
    local ov, oraw, err = readOverride(okey)
    if err then return nil, err end
    return ov, oraw, 0, 0, 0, 0, 0, 0
  end
  local start, stop, count, last, skew, bare = parseFixed(raw)
  if not start then return nil, stateError(key, raw) end
  if bare then return false, false, #raw, start, stop, count, last, skew end
  local ov, oraw, err = readOverride(okey)
  if err then return nil, err end
  return ov, oraw, #raw, start, stop, count, last, skew
end

-- loadState returns the state of the bucket (kind BUCKET) or fixed
-- window (FIXED) at key as this call has it in seen, reading it at the key's
-- first decision of the call (or taking raw, its value as MGET read it,
-- see readBucket); or nil and an error reply.
local function loadState(key, okey, seen, kind, raw)
  local s = seen[key]
  if s then return s end
  if kind == BUCKET then
    local ov, oraw, size, tat, f, sr, last, skew, e = readBucket(key, okey, raw)
    if ov == nil then return nil, oraw end
    s = newBucket(ov, oraw, size, tat, f, sr, last, skew, e)
  else
    local ov, oraw, size, start, stop, count, last, skew = readWindow(key, okey, raw)
    if ov == nil then return nil, oraw end
    s = newWindow(ov, oraw, size, start, stop, count, last, skew)
  end
  seen[key] = s
  return s
end

-- liveOverride returns a key's override ov, or false for none or an
-- expired one at now, and whether the fast path decides with it: a lone
-- limit of the kind (BUCKET or FIXED; an override's window is
-- never a calendar one) is decided here, with its parameters; other
-- limits are decide.lua's, and the request's record then holds the
-- override alone, which tells the client to send the request there.
local function liveOverride(ov, now, kind)
  if not ov or (ov.expires and ov.expires <= now) then return false, true end
  return ov, #ov.specs == 1 and ov.specs[1].kind == kind
end

-- writeState writes v, a state, to key, whose value is size bytes long
-- (0 for none): with the expiry px (ms), or keeping the key's own
-- (false). A value of the same length is written over the old one in
-- place (SETRANGE), which keeps the expiry as SET's KEEPTTL does, but
-- answers a number, where SET's status reply becomes a table in Lua.
-- Its offset is a string, and so is the expiry
-- (fmt): Redis would format a number argument with %.17g, which costs
-- more.
local function writeState(key, v, size, px)
  if px then
    call('SET', key, v, 'PX', fmt(px))
  elseif #v == size then
    call('SETRANGE', key, '0', v)
  else
    call('SET', key, v, 'KEEPTTL')
  end
end

-- callNow is the server's TIME (µs) as this call first read it, or false
-- before: callTime reads it once, and the decisions of one call are made
-- at one instant, as decide.lua's are. bucketBatch and bucketOne start
-- each call with none. A decision takes callNow when it is set, and calls
-- serverTime (callTime, or timeMicros for a lone call) only when it is
-- not: a Lua call is not free, and most of a batch's decisions would
-- make it just to read callNow. (Functions of the
-- chunk's, rather than ones made for each call, which would leave Lua's
-- collector one more object per call.)
local callNow = false
local function callTime()
  if not callNow then callNow = timeMicros() end
  return callNow
end

-- The argument that decideBucketKey unpacked last, and its ten numbers:
-- the requests of one Policy with one cost on the server's clock (now -1)
-- carry the same bytes, which Lua holds as one string, so each decision
-- after the first of them, in this call or a later one, compares two
-- pointers instead of unpacking again. A script's chunk, run at every call, starts with none. bMode
-- is what the argument does with its cost bN: TAKE, or REFUND for a
-- negative cost, whose amount bN then holds.
local bArg, bNow, bN, bExtra, bL, bR, bP, bTauQ, bTauR, bIq, bIr = false, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0
local bMode = TAKE
local function unpackBucketArg(arg)
  bNow, bN, bExtra, bL, bR, bP, bTauQ, bTauR, bIq, bIr = sunpack('>dddddddddd', arg)
  bArg, bMode = arg, TAKE
  if bN < 0 then bMode, bN = REFUND, -bN end
end

-- overrideBucket returns the parameters of a request of cost n on a key
-- whose override ov is a lone bucket (see liveOverride): its quota, rate,
-- period, tau and n*T (as decideBucketKey's argument has them).
local function overrideBucket(ov, n)
  local sp = ov.specs[1]
  local L, R, P = sp.quota, sp.rate, sp.period
  local iq, ir = sp.tq, sp.tr
  if n ~= 1 and n <= L then iq, ir = mulDiv(n, P, R) end
  return L, R, P, sp.tauQ, sp.tauR, iq, ir
end

-- decideBucketKey decides one request on the bucket whose state is key,
-- which other requests of the call name too: on the call's state of the
-- key (see loadState), which it leaves for bucketFlush to write.
-- arg is ten big-endian doubles (struct.pack '>dddddddddd'), which cost
-- Redis far less to read than ten decimal strings: now in µs (or -1 for
-- the server's TIME, which serverTime reads), the cost n (0 peeks, and
-- below 0 gives -n back, at most the quota, as core's Spec.Refund),
-- milliseconds added to the expiry, quota, rate, period (µs), then tau and
-- n*T as quotient and remainder (tauQ, tauR, iq, ir), which the client
-- computes exactly.
-- It returns the decision's record (see RECORD_DECISION), or nil and an
-- error reply: as a second value, which costs Lua less to tell from a
-- record than the type of one value does; then whether the request was
-- allowed, and whether it was charged (see decideAll). undo gives back
-- what the request took instead (see decideAll).
local function decideBucketKey(key, okey, arg, serverTime, seen, raw, undo)
  if arg ~= bArg then unpackBucketArg(arg) end
  local now, n, extra, L, R, P, tauQ, tauR, iq, ir = bNow, bN, bExtra, bL, bR, bP, bTauQ, bTauR, bIq, bIr
  local mode = bMode
  if undo then mode = REFUND end
  local onServer = now < 0
  if onServer then now = callNow or serverTime() end

  local s = seen[key]
  if not s then
    local err
    s, err = loadState(key, okey, seen, BUCKET, raw)
    if not s then return nil, err end
  end

  -- The key's override, if it has one (see liveOverride).
  local ov, here = s.ov, true
  if ov then ov, here = liveOverride(ov, now, BUCKET) end
  if not here then return elsewhere(s.oraw) end
  if ov then L, R, P, tauQ, tauR, iq, ir = overrideBucket(ov, n) end
  if mode == REFUND and n > L then n = L end -- at most the quota, as core's Refund

  local allowed, nt, nf, remaining, retry, reset, t, sk = decideBucket(s.tat, s.f, s.sr, s.last, s.skew, now, n, L, R, P, tauQ, tauR, iq, ir, mode)
  if n == 0 then allowed, retry = true, 0 end

  -- A refund on a key that holds nothing leaves it so, as decide.lua's.
  if allowed and n > 0 and (mode == TAKE or s.found) then
    local ttl = (reset + 999) / 1000
    ttl = ttl - ttl % 1 + extra -- floor (see FLOOR)
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
  local charged = allowed and n > 0 and mode ~= REFUND
  if ov then return record(s.oraw, allowed, remaining, retry, reset), nil, allowed, charged end
  return spack('>Bdddd', RECORD_DECISION, allowed and 1 or 0, remaining, retry, reset), nil, allowed, charged
end

-- decideBucketLone is decideBucketKey for a key that no other request of
-- the call names, every lone decision's and most of a batch's over many
-- keys: the same decision, on the key's state in locals, written at once;
-- raw is the key's value if the call read it already (see readBucket).
-- A table for the state, and the call's table of them, would cost more
-- than the decision itself saves unless a batch names the key many
-- times. For the same reason (a Lua call is not free), the commonest
-- state, one that MGET read for a key without an override, skips
-- readBucket, and its commonest write skips fmtBucket and writeState.
local function decideBucketLone(key, okey, arg, serverTime, raw)
  if arg ~= bArg then unpackBucketArg(arg) end
  local now, n, extra, L, R, P, tauQ, tauR, iq, ir = bNow, bN, bExtra, bL, bR, bP, bTauQ, bTauR, bIq, bIr
  local mode = bMode
  local onServer = now < 0
  if onServer then now = callNow or serverTime() end

  -- A state that MGET read and that says the key has no override, the
  -- commonest, is parsed here; any other goes through readBucket.
  local ov, oraw, size, tat, f, sr, last, skew, e, bare
  if raw == true then -- a new key without an override (see markAbsent)
    ov, oraw, size, tat, f, sr, last, skew, e, bare = false, false, 0, 0, 0, 0, 0, 0, 0, true
  elseif raw then
    tat, f, sr, last, skew, e, bare = parseBucket(raw)
    if bare then ov, oraw, size = false, false, #raw end
  end
  if not bare then
    ov, oraw, size, tat, f, sr, last, skew, e = readBucket(key, okey, raw)
    if ov == nil then return nil, oraw end
  end
  if ov then
    local here
    ov, here = liveOverride(ov, now, BUCKET)
    if not here then return elsewhere(oraw) end
    if ov then L, R, P, tauQ, tauR, iq, ir = overrideBucket(ov, n) end
  end
  if mode == REFUND and n > L then n = L end -- at most the quota, as core's Refund

  local allowed, nt, nf, remaining, retry, reset, t, sk = decideBucket(tat, f, sr, last, skew, now, n, L, R, P, tauQ, tauR, iq, ir, mode)
  if n == 0 then allowed, retry = true, 0 end

  -- A refund on a key that holds nothing leaves it so, as decide.lua's.
  if allowed and n > 0 and (mode == TAKE or size > 0) then
    local ttl = (reset + 999) / 1000
    ttl = ttl - ttl % 1 + extra -- floor (see FLOOR)
    if ttl < 1 then ttl = 1 end
    local px = ttl
    if not onServer then
      e = 0
    elseif now + ttl * 1000 <= e then
      px = false -- bucketExpiry's commonest answer, without a Lua call
    else
      px, e = bucketExpiry(e, now, ttl)
    end
    if not px and bare and size == 25 and nf == 0 and sk == 0 then
      -- writeState(key, fmtBucket(...)) for the commonest write, written
      -- out: the short form of a key without an override, over a value
      -- of that form, keeping the key's expiry. What changes is tat and
      -- d, after the byte that says the form; e is the one read (px is
      -- false). Two numbers pack for less than four.
      call('SETRANGE', key, '1', spack('>dd', nt, nt - t))
    else
      writeState(key, fmtBucket(nt, nf, R, t, sk, e, not oraw), size, px)
    end
  elseif size > 0 and sk > skew then
    writeState(key, fmtBucket(tat, f, sr, last, sk, e, not oraw), size, false) -- the clock stepped back
  end
  if ov then return record(oraw, allowed, remaining, retry, reset) end
  return spack('>Bdddd', RECORD_DECISION, allowed and 1 or 0, remaining, retry, reset)
end

-- The argument that decideWindowKey unpacked last, and its five numbers,
-- as for a bucket (bArg).
local wArg, wNow, wN, wExtra, wL, wP = false, 0, 0, 0, 0, 0
local function unpackWindowArg(arg)
  wNow, wN, wExtra, wL, wP = sunpack('>ddddd', arg)
  wArg = arg
end

-- windowExpiry returns the expiry (ms) to set on a fixed window's key
-- charged at now (µs) by a decision that returned reset and hold: the
-- decision's ttl on the client's clock; on the server's (onServer) a
-- slack beyond it, a quarter of it but at least a second, as a bucket's
-- (see bucketExpiry), unless the key's window is the one it held (same
-- is true) and its expiry, set when the window began, covers it: false.
-- A client's next request, often in the next window, then finds a state
-- that says whether the key has an override, where a missing key makes
-- it look.
local function windowExpiry(onServer, same, reset, hold, extra)
  local ttl = (reset + hold + 999) / 1000
  ttl = ttl - ttl % 1 + extra -- floor (see FLOOR)
  if ttl < 1 then ttl = 1 end
  if not onServer then return ttl end
  if same then return false end
  return ttl + max(1000, floor(ttl / 4))
end

-- decideWindowKey decides one request on the fixed window whose state is
-- key, as decideBucketKey does on a bucket. arg is five big-endian
-- doubles (struct.pack '>ddddd'): now in µs (or -1 for the server's TIME),
-- the cost n (0 peeks; -n charges n whatever the limit says, as core's
-- Spec.Charge), milliseconds added to the expiry, quota and period (µs).
local function decideWindowKey(key, okey, arg, serverTime, seen, raw, undo)
  if arg ~= wArg then unpackWindowArg(arg) end
  local now, n, extra, L, P = wNow, wN, wExtra, wL, wP
  local onServer = now < 0
  if onServer then now = callNow or serverTime() end
  local mode = TAKE
  if n < 0 then mode, n = CHARGE, -n end
  if undo then mode = REFUND end

  local s = seen[key]
  if not s then
    local err
    s, err = loadState(key, okey, seen, FIXED, raw)
    if not s then return nil, err end
  end

  -- The key's override, if it has one (see liveOverride).
  local ov, here = s.ov, true
  if ov then ov, here = liveOverride(ov, now, FIXED) end
  if not here then return elsewhere(s.oraw) end
  if ov then L, P = ov.specs[1].quota, ov.specs[1].period end
  if mode ~= TAKE then n = min(n, L) end -- at most the quota, as core's Charge and Refund

  local allowed, remaining, retry, reset, start, stop, count, t, sk, hold = decideFixed(s.found, s.start, s.stop,
    s.count, s.last, s.skew, now, n, L, P, 0, 0, 0, mode)
  if n == 0 then allowed, retry = true, 0 end

  if allowed and n > 0 then
    -- A refund that empties the window keeps the key to the window's end,
    -- as decide.lua's stepFixed.
    if count == 0 then hold = max(hold, stop - t) end
    local px = windowExpiry(onServer, s.found and s.start == start and s.stop == stop and sk == 0 and s.skew == 0,
      reset, hold, extra)
    if px then s.ttl = px end
    s.start, s.stop, s.count, s.last, s.skew, s.found = start, stop, count, t, sk, true
    if not s.dirty then s.dirty = true; seen[#seen + 1] = key end
  elseif s.found and sk > s.skew then
    s.skew = sk -- the clock stepped back, as for a bucket
    if not s.dirty then s.dirty = true; seen[#seen + 1] = key end
  end
  local charged = allowed and n > 0 and mode ~= REFUND
  if ov then return record(s.oraw, allowed, remaining, retry, reset), nil, allowed, charged end
  return spack('>Bdddd', RECORD_DECISION, allowed and 1 or 0, remaining, retry, reset), nil, allowed, charged
end

-- decideWindowLone is decideWindowKey for a key that no other request of
-- the call names, as decideBucketLone is for a bucket.
local function decideWindowLone(key, okey, arg, serverTime, raw)
  if arg ~= wArg then unpackWindowArg(arg) end
  local now, n, extra, L, P = wNow, wN, wExtra, wL, wP
  local onServer = now < 0
  if onServer then now = callNow or serverTime() end
  local mode = TAKE
  if n < 0 then mode, n = CHARGE, -n end

  -- As in decideBucketLone: a state that MGET read and that says the key
  -- has no override is parsed here.
  local ov, oraw, size, s, se, count, last, skew, bare
  if raw == true then -- a new key without an override (see markAbsent)
    ov, oraw, size, s, se, count, last, skew, bare = false, false, 0, 0, 0, 0, 0, 0, true
  elseif raw then
    s, se, count, last, skew, bare = parseFixed(raw)
    if bare then ov, oraw, size = false, false, #raw end
  end
  if not bare then
    ov, oraw, size, s, se, count, last, skew = readWindow(key, okey, raw)
    if ov == nil then return nil, oraw end
  end
  local found = size > 0
  if ov then
    local here
    ov, here = liveOverride(ov, now, FIXED)
    if not here then return elsewhere(oraw) end
    if ov then L, P = ov.specs[1].quota, ov.specs[1].period end
  end
  if mode == CHARGE then n = min(n, L) end -- at most the quota, as core's Charge

  local allowed, remaining, retry, reset, start, stop, nc, t, sk, hold = decideFixed(found, s, se, count, last, skew,
    now, n, L, P, 0, 0, 0, mode)
  if n == 0 then allowed, retry = true, 0 end

  if allowed and n > 0 then
    local px = false -- windowExpiry's commonest answer (the window the key holds), without a Lua call
    if not (onServer and found and s == start and se == stop and sk == 0 and skew == 0) then
      px = windowExpiry(onServer, found and s == start and se == stop and sk == 0 and skew == 0, reset, hold, extra)
    end
    if not px and size == 41 and not oraw then
      call('SETRANGE', key, '0', spack('>Bddddd', 5, start, stop, nc, t, sk)) -- as decideBucketLone's
    else
      writeState(key, fmtFixed(start, stop, nc, t, sk, not oraw), size, px)
    end
  elseif found and sk > skew then
    writeState(key, fmtFixed(s, se, count, last, sk, not oraw), size, false) -- the clock stepped back
  end
  if ov then return record(oraw, allowed, remaining, retry, reset) end
  return spack('>Bdddd', RECORD_DECISION, allowed and 1 or 0, remaining, retry, reset)
end

-- decideFastKey decides one request of the fast path: a fixed window's
-- or a bucket's, by the length of its argument, on the call's state of
-- its key in seen, or without (nil) on a key of its own; raw is the key's
-- value if the call read it already (see readBucket).
local function decideFastKey(key, okey, arg, serverTime, seen, raw)
  if #arg < BUCKET_ARG then
    if seen then return decideWindowKey(key, okey, arg, serverTime, seen, raw) end
    return decideWindowLone(key, okey, arg, serverTime, raw)
  end
  if seen then return decideBucketKey(key, okey, arg, serverTime, seen, raw) end
  return decideBucketLone(key, okey, arg, serverTime, raw)
end

-- bucketFlush writes the states in seen that decideFastKey changed, once
-- each, in the order they were first changed: with the expiry that the
-- call's charges need, or keeping the key's own when it covers them (see
-- bucketExpiry) or only the key's skew moved.
local function bucketFlush(seen)
  for i = 1, #seen do
    local key = seen[i]
    local s = seen[key]
    if s.window then
      writeState(key, fmtFixed(s.start, s.stop, s.count, s.last, s.skew, not s.oraw), s.size, s.ttl)
    else
      writeState(key, fmtBucket(s.tat, s.f, s.sr, s.last, s.skew, s.e, not s.oraw), s.size, s.ttl)
    end
  end
end

-- bucketOne decides one request on the bucket or fixed window whose state
-- is key, and whose override key is okey: the fast path's function.
local function bucketOne(key, okey, arg)
  callNow = false
  local r, err = decideFastKey(key, okey, arg, timeMicros, nil)
  return r or err
end

-- errRecord returns the record of the error reply err's message.
local function errRecord(err)
  return spack('>BI4', RECORD_ERROR, #err.err) .. err.err
end

-- checkGroup checks the count requests of a group whose keys start at
-- keys[k] and arguments at argv[a] (the values of keys from keys[base + 1]
-- on as MGET read them in rest, see bucketBatch; the override key of
-- keys[i] is keys[n + i]), and returns nothing
-- when the fast path decides them all, or the record that answers the
-- whole group instead: an error, or an override that is decide.lua's. So
-- a group is decided whole or not at all, as decide.lua decides it. A
-- request on a key of its own (by its argument's length, see bucketBatch)
-- whose state says the key has no override is decided on its own, as a
-- lone request; any other's state is loaded in seen (see loadState), on
-- which bucketBatch then decides it. A lone one's state is parsed twice,
-- here and by its decision, which costs Redis less than loading it. In an
-- all-or-nothing group (all), every state is loaded in seen, where
-- decideAll can give a charge back before anything is written.
local function checkGroup(keys, argv, k, a, count, serverTime, seen, rest, base, n, all)
  for j = 0, count - 1 do
    local key, arg = keys[k + j], argv[a + j]
    local size, raw = #arg, rest[k + j - base]
    local bare, _ = false, nil
    if raw == true then
      -- A new key without an override (see markAbsent), of its own.
      bare = size == WINDOW_ARG or size == BUCKET_ARG
    elseif raw and size == WINDOW_ARG then
      _, _, _, _, _, bare = parseFixed(raw)
    elseif raw and size == BUCKET_ARG then
      _, _, _, _, _, _, bare = parseBucket(raw)
    end
    if all or not bare then
      local kind = BUCKET
      if size < BUCKET_ARG then kind = FIXED end
      local s, err = loadState(key, keys[n + k + j], seen, kind, raw)
      if not s then return errRecord(err) end
      if s.ov then
        -- Only an override can send the group elsewhere (liveOverride).
        local now = sunpack('>d', arg)
        if now < 0 then now = callNow or serverTime() end
        local _, here = liveOverride(s.ov, now, kind)
        if not here then return elsewhere(s.oraw) end
      end
    end
  end
end

-- decideAll decides an all-or-nothing group of count requests, whose keys
-- start at keys[k] and arguments at argv[a], and whose states checkGroup
-- loaded in seen, as decide.lua's decideGroup does: in order, each seeing
-- the ones before it; when a request that is not advisory is denied
-- (flags, a string of count bytes, says '1' for an advisory request; false
-- for none), each request that was charged gives its charge back, the
-- latest first, at the same instant, and its record reports the state
-- after that, with allowed 2 (undone). Nothing is written before
-- bucketFlush, so no other client sees the charges. keys[n + i] is
-- keys[i]'s override key (see bucketBatch). It appends the records to out
-- after m, and returns the new m.
local groupCharged = {} -- for each request of the group: whether it was charged
local undoneBytes = false -- allowed 2 as a record's double, packed at first use
local function decideAll(keys, argv, k, a, count, serverTime, seen, flags, out, m, n)
  local undo = false
  for j = 0, count - 1 do
    local key, arg = keys[k + j], argv[a + j]
    local d, err, allowed, charged
    if #arg < BUCKET_ARG then
      d, err, allowed, charged = decideWindowKey(key, keys[n + k + j], arg, serverTime, seen, nil)
    else
      d, err, allowed, charged = decideBucketKey(key, keys[n + k + j], arg, serverTime, seen, nil)
    end
    -- checkGroup loaded every state and checked every override, so
    -- neither an error nor a hand-on comes back (allowed is nil then):
    -- either undoes the group all the same.
    if allowed == nil then
      d, undo, charged = d or errRecord(err), true, false
    elseif not allowed and not (flags and byte(flags, j + 1) == 49) then -- '1'
      undo = true
    end
    out[m + 1 + j] = d
    groupCharged[j + 1] = charged
  end
  if undo then
    if not undoneBytes then undoneBytes = spack('>d', 2) end
    for j = count - 1, 0, -1 do
      if groupCharged[j + 1] then
        local key, arg = keys[k + j], argv[a + j]
        local d
        if #arg < BUCKET_ARG then
          d = decideWindowKey(key, keys[n + k + j], arg, serverTime, seen, nil, true)
        else
          d = decideBucketKey(key, keys[n + k + j], arg, serverTime, seen, nil, true)
        end
        out[m + 1 + j] = sub(d, 1, 1) .. undoneBytes .. sub(d, 10)
      end
    end
  end
  return m + count
end

-- absentKeys holds the keys that markAbsent asks about, filled from the
-- start by each call (see records).
local absentKeys = {}

-- UNPACK_MAX is the most keys that one command of a call names: Lua
-- passes a command's arguments on its C stack, which holds about 8,000
-- (LUAI_MAXCSTACK), so a batch of more keys (a group of thousands, say,
-- an Envoy request of as many descriptors) is read in parts of it.
local UNPACK_MAX = 1000

-- mget returns the values of keys[from] to keys[to], in order, as one
-- MGET of them returns them: in parts of UNPACK_MAX keys when there are
-- more.
local function mget(keys, from, to)
  if to - from < UNPACK_MAX then return call('MGET', unpack(keys, from, to)) end
  local vals, n = {}, 0
  for i = from, to, UNPACK_MAX do
    local part = call('MGET', unpack(keys, i, min(i + UNPACK_MAX - 1, to)))
    for j = 1, #part do vals[n + j] = part[j] end
    n = n + #part
  end
  return vals
end

-- anyExists reports whether any of keys[1] to keys[m] exists, as one
-- EXISTS of them would, in parts of UNPACK_MAX keys when there are more.
local function anyExists(keys, m)
  for i = 1, m, UNPACK_MAX do
    if call('EXISTS', unpack(keys, i, min(i + UNPACK_MAX - 1, m))) ~= 0 then return true end
  end
  return false
end

-- markAbsent takes vals, the values that MGET read of keys[base + 1] on
-- (whose override keys are n further on, see bucketBatch),
-- and when none of the keys at which it found no value (false) holds
-- anything, and none of them has an override (one EXISTS of them all and
-- their override keys), sets those values to true. Their decisions then
-- take them for new states of keys without an override (see readBucket)
-- without a GET of each key (which tells a missing key from one of
-- another type, which MGET does not) and of its override key: a batch of
-- new keys, a limit per client address say, makes one call to Redis for
-- them rather than two each. When any of them holds something, each
-- decision reads its own, as before.
local function markAbsent(vals, keys, base, n)
  local m = 0
  for i = 1, #vals do
    if not vals[i] then
      absentKeys[m + 1], absentKeys[m + 2] = keys[base + i], keys[n + base + i]
      m = m + 2
    end
  end
  if m == 0 or anyExists(absentKeys, m) then return end
  for i = 1, #vals do
    if not vals[i] then vals[i] = true end
  end
end

-- groupSizes remembers the size of each group mark ("g<count>") that
-- bucketBatch read, one entry per size: tonumber (C's strtod) costs Lua
-- far more than looking up the interned mark. A script's chunk, run at every call, starts with none.
local groupSizes = {}

-- KEY_MAP is the first byte of the argument that maps a batch's requests
-- to their keys when the call declares each distinct key once (see
-- distinctKeys in fastpath.go).
local KEY_MAP = {{KEY_MAP}}

-- expandKeys returns the keys of a batch whose last argument, map, maps
-- its requests to their keys: KEY_MAP, the number of requests, then per
-- run of consecutive requests on one key its place among the distinct
-- state keys (from 1) and the run's length, each 2 big-endian bytes; the
-- distinct state keys are the first half of keys and their override keys
-- the second. It returns them as bucketBatch reads every batch's, one
-- state key per request then the override keys in the same order, and
-- the number of requests. A run costs a call of byte, a request two
-- stores: a hot key's batch is one run.
-- expandArgs returns argv's na arguments as bucketBatch reads them: when
-- mark, the last one's first byte, is ARG_MAP, that argument is a map
-- (see argRuns in fastpath.go), ARG_MAP then 2 big-endian bytes for each
-- argument before it, and they are returned each as many times as it
-- says, and how many that makes; otherwise argv and na as they are. A
-- run costs a call of byte, an argument a store.
-- Each fills a table of its own from the start at each call (mappedN,
-- filled: how far the last call did). Those tables and ARG_MAP are
-- locals of blocks because the library's chunk holds every script's
-- locals, which Lua bounds at 200 at a time.
local expandKeys, expandArgs
do
  local mappedKeys, mappedN = {}, 0
  expandKeys = function(keys, map)
    local d, t = floor(#keys / 2), mappedKeys
    local h, l = byte(map, 2, 3)
    local n, i = h * 256 + l, 0
    for p = 4, #map, 4 do
      local jh, jl, ch, cl = byte(map, p, p + 3)
      local j = jh * 256 + jl
      local key, okey = keys[j], keys[d + j]
      for _ = 1, ch * 256 + cl do
        i = i + 1
        t[i], t[n + i] = key, okey
      end
    end
    for k = 2 * n + 1, mappedN do t[k] = nil end
    mappedN = 2 * n
    return t, n
  end
end
do
  local ARG_MAP = {{ARG_MAP}}
  local mapped, filled = {}, 0
  expandArgs = function(argv, na, mark)
    if mark ~= ARG_MAP then return argv, na end
    local map, t, i = argv[na], mapped, 0
    for r = 1, na - 1 do
      local h, l = byte(map, 2 * r, 2 * r + 1)
      local arg = argv[r]
      for _ = 1, h * 256 + l do
        i = i + 1
        t[i] = arg
      end
    end
    for k = i + 1, filled do t[k] = nil end
    filled = i
    return t, i
  end
end

-- records holds a batch's records until they are joined into its reply:
-- one table for every call (in a script's chunk, which runs at every
-- call, one per call), which a call fills from the start, so that what an
-- earlier call left after its end is never read. A new table would grow,
-- and reallocate, at every call.
local records = {}

-- bucketBatch decides, in order, one request per key of the first half of
-- keys (KEYS), each on the bucket or fixed window whose state is that key,
-- and whose override key is at the same place in the second half (or,
-- when the last argument is a key map, one request per entry of the map,
-- on the key it names: see expandKeys), with
-- its argument in argv (ARGV, as decideFastKey's; when the last argument
-- is an argument map, argv as expandArgs expands it), or a group of requests: an argument "g<count>"
-- before the count requests' own, decided in order, one after the other,
-- as decide.lua decides a group that is not all or nothing; "G<count>", or
-- "H<count>" and its advisory requests' flags, before a group that is
-- (see decideAll), whose requests' override keys are declared as any
-- other's. Each decision sees the ones before it. A request whose argument is one byte longer
-- than its kind's names a key that another request of the call names too
-- (which the client knows, and Lua would need a table to find out): it
-- is decided on the call's state of its key (see loadState), and so is a
-- request of a group unless checkGroup finds it can be decided on its
-- own; any other on its own. It returns the requests'
-- records, in order, as one string: a decision that fails has the record
-- of its error, and each request of a group that the fast path does not
-- decide the record that says why (see checkGroup).
-- On a Cluster, crossBatch (cross.lua) calls it once per slot with read,
-- the values of the lone requests' keys that it read already, and the
-- call's time kept from one slot to the next (callNow is not reset).
local function bucketBatch(keys, argv, read)
  nBuckets, nWindows = 0, 0
  if not read then callNow = false end
  local out, serverTime = records, callTime
  local k, a, m = 1, 1, 0 -- m records in out: # searches for the end
  local na, n = #argv, nil
  local mark = na > 0 and byte(argv[na])
  if mark == KEY_MAP then
    keys, n = expandKeys(keys, argv[na])
    na = na - 1
  else
    argv, na = expandArgs(argv, na, mark) -- a batch with a key map has no argument map
    n = floor(#keys / 2) -- the requests; keys[n + k] is keys[k]'s override key
  end
  -- The requests on keys of their own come first (see lonesFirst in
  -- fastpath.go), and one MGET reads their states: each call from Lua has
  -- a fixed cost besides the command's own work.
  local lone, pre = 0, false
  while lone < na do
    local size = #argv[lone + 1]
    if size ~= BUCKET_ARG and size ~= WINDOW_ARG then break end
    lone = lone + 1
  end
  if read then
    pre = read
    markAbsent(pre, keys, 0, n)
  elseif lone > 1 then
    pre = mget(keys, 1, lone)
    markAbsent(pre, keys, 0, n)
  end
  -- seen, the states of keys that several requests name (see loadState):
  -- those requests and the groups all come after the lone ones, and a
  -- batch of keys of their own needs none.
  local seen = lone < na and {}
  -- From the first group on, one MGET reads every key left (an Envoy
  -- request's descriptors are a group each): a key that several requests
  -- name is read more than once there, which costs Redis less than a GET
  -- per key as long as most keys are not (one hot key of lone requests,
  -- decided on the call's state, is read with one GET).
  local rest, base = false, 0
  while a <= na do
    local arg = argv[a]
    local size = #arg
    if size < WINDOW_ARG then -- "g<count>", "G<count>" or "H<count>" and its flags
      local count = groupSizes[arg]
      if not count then
        count = tonumber(sub(arg, 2))
        groupSizes[arg] = count
      end
      local head, flags = sub(arg, 1, 1), false
      if head == GROUP_FLAGGED then -- its advisory requests' flags follow
        flags, a = argv[a + 1], a + 1
      end
      if not rest then
        rest, base = mget(keys, k, n), k - 1
        markAbsent(rest, keys, base, n)
      end
      local r = checkGroup(keys, argv, k, a + 1, count, serverTime, seen, rest, base, n, head ~= GROUP)
      if not r and head ~= GROUP then
        m = decideAll(keys, argv, k, a + 1, count, serverTime, seen, flags, out, m, n)
      else
        for j = 0, count - 1 do
          m = m + 1
          local d, err = r, nil
          if not r then
            local key = keys[k + j]
            -- On the call's state of its key if checkGroup loaded it.
            d, err = decideFastKey(key, keys[n + k + j], argv[a + 1 + j], serverTime, seen[key] and seen, rest[k + j - base])
          end
          out[m] = d or errRecord(err)
        end
      end
      k, a = k + count, a + 1 + count
    else
      -- decideFastKey's dispatch, written out: a lone decision's path.
      local r, err
      if size == BUCKET_ARG then
        r, err = decideBucketLone(keys[k], keys[n + k], arg, serverTime, pre and pre[k])
      elseif size == WINDOW_ARG then
        r, err = decideWindowLone(keys[k], keys[n + k], arg, serverTime, pre and pre[k])
      elseif size > BUCKET_ARG then
        r, err = decideBucketKey(keys[k], keys[n + k], arg, serverTime, seen, rest and rest[k - base])
      else
        r, err = decideWindowKey(keys[k], keys[n + k], arg, serverTime, seen, rest and rest[k - base])
      end
      m = m + 1
      out[m] = r or errRecord(err)
      k, a = k + 1, a + 1
    end
  end
  if seen then bucketFlush(seen) end
  return concat(out, '', 1, m)
end
