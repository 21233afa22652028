-- floodgate: decide a batch of requests, each against one or more limits,
-- each atomically, one after the other, exactly as if each had been a
-- script call of its own.
--
-- The algorithms mirror package core (core/algo.go): stepBucket and
-- decideFixed (in prelude.lua), stepSliding, stepLog and slidingAllowAt
-- have the names, the steps and the rounding of the Go functions; change
-- both together. The conformance suite and the differential fuzz test hold
-- them to identical results.
--
-- KEYS     the keys of every request in order: for each, the state of its
--          limit i (a string, or a sorted set for a sliding log), then
--          the key's override key; after every item's, the keys of
--          overrides' limits that the client declares (see undeclared)
-- ARGV[1]  milliseconds added to every expiry (0 with server time)
-- ARGV[2]  the number of distinct limits (specs) that follow, one
--          argument each: 11 big-endian doubles (struct.pack
--          '>ddddddddddd'), read by readSpec into fields of the same names:
--          kind, quota, rate, period, tauQ, tauR, tq, tr, c0, c1, c2
--   kind: 1 bucket, 2 fixed window, 3 sliding window counter, 4 sliding log
--   tau = quota*period/rate = tauQ + tauR/rate and T = period/rate =
--   tq + tr/rate (µs), for a bucket; the client works them out exactly.
--   c0, c1, c2: for a calendar window, [c0, c1) is the window that
--   contains the client's now and [c1, c2) the next one (Lua has no time
--   zones, so the client computes them); 0 for every other limit.
-- then the number of items, each a request or a group. A request is: its
-- number of limits nk (or "a<nk>" for an advisory request of a group,
-- whose denial does not undo it), the cost n (n = 0 peeks; -n charges n
-- whatever the limits say, as core's Spec.Charge; the string "r<n>" gives
-- n back, as Spec.Refund), now in microseconds (or -1 for the server's
-- TIME), and the nk indexes (from 1) of its limits' specs. A group is
-- "g<count>" (or "G<count>" for all or nothing) and its count requests:
-- core's Grouper.TakeGroup (see decideGroup). An item "o" sets or
-- deletes a key's override (see carry). A request on a key with an
-- override (see parseOverride) is decided against the override's limits.
-- Returns, for each request in order, for a key with an override the
-- string "=" and the override's value, then 4 integers per limit (the
-- override's limits, if any): allowed (0/1,
-- or 2 for a request that an all-or-nothing group undid), remaining, retry
-- (µs, -1 never), reset (µs); or, for a request (or a group) whose state is
-- not floodgate's, one string: the error. Other items of the batch are
-- unaffected.
--
-- Every number stays below 2^53, so Lua's doubles hold it exactly.

-- (prelude.lua comes first: mulDiv, stepBucket, fmt, fmt5, timeline,
-- parseBucket, fmtBucket, decideBucket, parseFixed, fmtFixed,
-- markOverridden, decideFixed, corrupt, wrongType, readError.) This file
-- defines decideBatch(keys, argv), which decides one call. As a script,
-- the chunk ends by calling it with KEYS and ARGV; in the function library
-- the chunk runs once, at load, and each FCALL calls it: that spares Redis
-- building every helper below at every call.

-- MAXLOG is core's MaxLogQuota: the largest sliding log limit that a
-- request is decided against, which bounds the members it adds.
local MAXLOG = {{MAXLOG}}
-- The last bytes of a bucket's and a fixed window's state keys, their
-- kinds' letters (see SUFFIXES), by which decideBatch writes each form.
local BUCKET_LETTER, FIXED_LETTER = {{BUCKET_LETTER}}, {{FIXED_LETTER}}

-- The call's keys and arguments, as KEYS and ARGV are to a script, and
-- what the call has read and written. decideBatch sets them all afresh at
-- each call: in the library they live on from one call to the next.
local KEYS, ARGV
-- ms added to every expiry (ARGV[1]), the call's limits (see readSpec),
-- and the server's TIME in µs once the call has read it.
local extra, specs, servernow
-- The string states that this batch has read or written, by key, parsed
-- into their five numbers (false for a missing key), and the writes to
-- make when the batch ends, so that a key decided many times in one batch
-- (a hot key) is read once and written once. Each write is the key's last
-- state with the expiry its last decision gave it (false: keep the
-- expiry), exactly as one call per decision would leave it.
local states, ttls, dirty
-- The overrides this batch has read or written, by override key: the
-- parsed override (see parseOverride), or false for none.
local overrides

-- num is tonumber for the short arguments of a request (its count of
-- limits, its cost, its limits' indexes and now = -1): tonumber runs C's
-- strtod, far dearer than a table lookup. It remembers the numbers of strings of at most 4
-- characters, which a library keeps from one call to the next (at most
-- NUMS_MAX of them; a script starts afresh at every call).
local nums, nnums, NUMS_MAX = {}, 0, 4096
local function num(s)
  local v = nums[s]
  if v then return v end
  v = tonumber(s)
  if v and #s <= 4 then
    if nnums >= NUMS_MAX then nums, nnums = {}, 0 end
    nums[s], nnums = v, nnums + 1
  end
  return v
end

-- keySet holds the call's keys as a set, built when an override first
-- needs it (see undeclared): nil before.
local keySet

-- undeclared returns the first of keys, an override's limits' keys (see
-- parseOverride), that the call's keys do not hold, or nil when it holds
-- them all. An override whose limits are of its Policy's kinds, the
-- commonest, has the request's own keys, KEYS[k0 + 1] to KEYS[k0 + nk],
-- which are looked at first; the client declares any others once it
-- knows the override (see undeclaredReply).
local function undeclared(keys, k0, nk)
  if #keys <= nk then
    local own = true
    for i = 1, #keys do
      if keys[i] ~= KEYS[k0 + i] then own = false; break end
    end
    if own then return nil end
  end
  if not keySet then
    keySet = {}
    for i = 1, #KEYS do keySet[KEYS[i]] = true end
  end
  for i = 1, #keys do
    if not keySet[keys[i]] then return keys[i] end
  end
end

-- undeclaredReply is the answer to an item that needs the keys of the
-- override raw at okey, which the call does not declare: "?", okey, a
-- newline and raw, from which the client works them out and sends the
-- item again with them. The item has changed nothing: its error undoes
-- its group, as any error does.
local function undeclaredReply(okey, raw)
  return {err = '?' .. okey .. '\n' .. raw}
end

-- lookupOverride returns the override at okey, the override key of a
-- request whose keys are KEYS[k0 + 1] to KEYS[k0 + nk], at now, false for
-- none (or an expired one), or nil and an error reply; an override with
-- limits whose keys the call does not declare gives undeclaredReply's.
local function lookupOverride(okey, now, k0, nk)
  local ov = overrides[okey]
  if ov == nil then
    local raw = rpcall('GET', okey)
    if type(raw) == 'table' and raw.err then return nil, readError(okey, raw.err) end
    ov = false
    if raw then
      ov = parseOverride(raw, okey)
      if not ov then return nil, corrupt(okey) end
    end
    overrides[okey] = ov
  end
  if ov and ov.expires and ov.expires <= now then return false end
  if ov and not ov.declared then
    if undeclared(ov.keys, k0, nk) then return nil, undeclaredReply(okey, ov.raw) end
    ov.declared = true
  end
  return ov
end

-- readState reads a string key holding five integers, which parse reads
-- from its value: a, b, c, and the latest charge and the skew (see
-- core.State). It returns found, a, b, c, last, skew (false and zeros for
-- a missing key), or nil and an error reply for a key of another type or
-- content.
local function readState(key, parse)
  local v = states[key]
  if v == nil then
    local raw = rpcall('GET', key)
    if type(raw) == 'table' and raw.err then return nil, readError(key, raw.err) end
    v = false
    if raw then
      local x, y, z, l, k = parse(raw)
      if not x then return nil, corrupt(key) end
      v = {x, y, z, l, k}
    end
    states[key] = v
  end
  if not v then return false, 0, 0, 0, 0, 0 end
  return true, v[1], v[2], v[3], v[4], v[5]
end

-- keepSkew records a grown skew on a key that is not charged, keeping its
-- expiry, as core's Commit does.
local function keepSkew(key, sk)
  local v = states[key]
  v[5] = sk
  if ttls[key] == nil then dirty[#dirty + 1] = key; ttls[key] = false end
end

-- A sliding window's state, "start:previous:current:last:skew" (see
-- stepSliding), or "start:previous:current" as earlier versions wrote it.
-- (A fixed window's is parseFixed's, in prelude.lua.)
local function parseSliding(raw)
  local x, y, z, l, k = match(raw, '^(%-?%d+):(%d+):(%d+):(%d+):(%d+)$')
  if x then return tonumber(x), tonumber(y), tonumber(z), tonumber(l), tonumber(k) end
  x, y, z = match(raw, '^(%-?%d+):(%d+):(%d+)$')
  if x then return tonumber(x), tonumber(y), tonumber(z), 0, 0 end
end

-- What a request writes, per limit: kind ('SET' or 'LOG'), key, the
-- values to write if it is charged, the time it was decided at and the
-- skew, the µs to keep the state beyond its reset (core's Spec.Hold), and
-- whether the skew grew (the clock stepped back), which is written even
-- if the request is not charged, as core's Commit does. Reused by every
-- request.
local wkind, wkey, wa, wb, wc, wt, wsk, whold, wgrew = {}, {}, {}, {}, {}, {}, {}, {}, {}
-- The cost each limit charges: the request's, or at most the quota for a
-- forced charge or a refund; and the request's mode.
local wn = {}
local wmode = TAKE

local function pending(i, kind, key, a, b, c, t, sk, hold, grew)
  wkind[i], wkey[i], wa[i], wb[i], wc[i], wt[i], wsk[i], whold[i], wgrew[i] = kind, key, a, b, c, t, sk, hold, grew
end

-- writeKind is what a step writes: kind, or nothing ('NONE') for a
-- refund on a key that holds nothing, which stays as it is.
local function writeKind(found, mode, kind)
  if mode == REFUND and not found then return 'NONE' end
  return kind
end

-- refundLog drops the n newest units of the sliding log at key, and moves
-- its clock member (b), if any, to the newest unit left, with the skew it
-- holds, as core's Commit does: a refund keeps the key's skew, even one
-- that its step found grown.
local function refundLog(key, n, clock)
  if clock then call('ZREM', key, clock) end
  call('ZREMRANGEBYRANK', key, -n, -1)
  if clock then
    local newest = call('ZRANGE', key, -1, -1, 'WITHSCORES')
    if newest[2] then call('ZADD', key, newest[2], clock) end
  end
end


-- Each step function decides a request of cost n at now against the limit
-- sp whose state is at key, records in slot i what to write if the
-- request is charged, and returns allowed, remaining, retry (-1 never) and
-- reset, or nil and an error reply.

local function stepBucketKey(sp, key, now, n, i, mode)
  local found, tat, f, sr, last, skew = readState(key, parseBucket)
  if found == nil then return nil, tat end
  local iq, ir = sp.tq, sp.tr -- n*T for the common n = 1
  if n ~= 1 then iq, ir = mulDiv(n, sp.period, sp.rate) end
  local allowed, nt, nf, remaining, retry, reset, t, sk = decideBucket(tat, f, sr, last, skew, now, n,
    sp.quota, sp.rate, sp.period, sp.tauQ, sp.tauR, iq, ir, mode)
  pending(i, writeKind(found, mode, 'SET'), key, nt, nf, sp.rate, t, sk, 0, found and sk > skew)
  return allowed, remaining, retry, reset
end

-- stepFixed is the fixed window counter (decideFixed, in prelude.lua).
local function stepFixed(sp, key, now, n, i, mode)
  local found, s, se, count, last, skew = readState(key, parseFixed)
  if found == nil then return nil, s end
  local allowed, remaining, retry, reset, start, stop, c, t, sk, hold = decideFixed(found, s, se, count, last, skew,
    now, n, sp.quota, sp.period, sp.c0, sp.c1, sp.c2, mode)
  -- A refund that empties the window leaves its limit full at once (reset
  -- 0), but the key still outlives the window: the fast path keeps a
  -- window key's expiry for the later charges of the same window
  -- (windowExpiry in bucket.lua), which would otherwise expire with it.
  if c == 0 then hold = max(hold, stop - t) end
  pending(i, writeKind(found, mode, 'SET'), key, start, stop, c, t, sk, hold, found and sk > skew)
  return allowed, remaining, retry, reset
end

-- slidingAllowAt returns the first time (µs) at which a request of cost
-- n <= L, denied now in the window starting at cur, would pass if nothing
-- else is admitted meanwhile.
local function slidingAllowAt(cur, W, L, prev, curr, n)
  local need = L - curr - n
  if need >= 0 then
    -- Later in this window: ceil(prev*(W-e)/W) <= need
    -- <=> e >= W - floor(need*W/prev).
    local q = mulDiv(need, W, prev)
    return cur + W - q
  end
  -- In the next window the current count becomes the previous one.
  local q = mulDiv(L - n, W, curr)
  return cur + W + W - min(q, W)
end

-- stepSliding is the sliding window counter. Its state is
-- "start:previous:current".
local function stepSliding(sp, key, now, n, i, mode)
  local found, s, sprev, scurr, last, skew = readState(key, parseSliding)
  if found == nil then return nil, s end
  local W, L = sp.period, sp.quota
  local tl, sk = now, 0
  if skew ~= 0 or now < last then tl, sk = timeline(now, last, skew) end
  if sk ~= 0 and s + 2 * W - sk <= now - now % W then
    -- Rejoin the clock, as core's rejoin.
    tl, sk, s, sprev, scurr = now, 0, 0, 0, 0
  end
  -- The windows are those of t; durations count from the time line tl.
  local t = max(tl, s)
  local e = t % W
  local cur = t - e
  local prev, curr = 0, 0
  if s == cur then prev, curr = sprev, scurr elseif s == cur - W then prev = scurr end
  if mode == REFUND then
    -- From the current window first, then from the previous one.
    local d = min(curr, n)
    curr, prev = curr - d, max(prev - (n - d), 0)
  end
  local q, r = mulDiv(prev, W - e, W)
  local est = q
  if r > 0 then est = est + 1 end
  local allowed, retry, reset = false, 0, 0
  if mode == REFUND then
    allowed = true
  elseif n > L then
    retry = -1
  elseif mode == CHARGE or est + curr + n <= L then
    allowed = true
    curr = min(curr + n, MAXDEBT)
  else
    retry = slidingAllowAt(cur, W, L, prev, curr, n) - tl
  end
  local hold = 0
  if sk > 0 then hold = W end
  pending(i, writeKind(found, mode, 'SET'), key, cur, prev, curr, tl, sk, hold, found and sk > skew)
  if curr > 0 then reset = cur + 2 * W - tl elseif est > 0 then reset = cur + W - tl end
  return allowed, max(L - est - curr, 0), retry, reset
end

-- stepLog is the sliding window log: a sorted set with one member per
-- admitted unit, scored by its time. A key whose time line runs ahead of
-- the clock also holds a member "~skew" scored as its newest mark, last in
-- the set (the marks are named by digits, which sort before "~"). The
-- newest score is the latest charge; the key reads at its time line (see
-- timeline) and rejoins the clock when its newest mark has expired by the
-- clock too, as core's rejoin.
local function stepLog(sp, key, now, n, i, mode)
  local W, L = sp.period, sp.quota
  local newest = rpcall('ZRANGE', key, -1, -1, 'WITHSCORES')
  if newest.err then return nil, readError(key, newest.err) end
  local last, skew, clock = 0, 0, nil
  if newest[2] then
    last = tonumber(newest[2])
    if not last or last ~= floor(last) then return nil, corrupt(key) end
    if sub(newest[1], 1, 1) == '~' then
      clock = newest[1]
      skew = tonumber(sub(clock, 2))
      if not skew then return nil, corrupt(key) end
    end
  end
  local t, sk = now, 0
  if skew ~= 0 or now < last then t, sk = timeline(now, last, skew) end
  if sk ~= 0 and last + W - sk <= now then
    call('DEL', key)
    t, sk, last, clock = now, 0, 0, nil
  end
  -- at is the time the log is read at; durations count from t. They
  -- differ only past the longest skew, as in Go.
  local at = max(t, last)
  -- Marks at or before at - W have expired (and the clock member with the
  -- newest of them).
  call('ZREMRANGEBYSCORE', key, '-inf', fmt(at - W))
  if last <= at - W then clock = nil end
  local total = call('ZCARD', key)
  if clock then total = total - 1 end
  if mode == CHARGE then
    -- A forced charge adds what fits in twice the limit, as core's
    -- logRoom: no request grows a log without bound. commit adds wn[i].
    n = min(n, max(2 * L - total, 0))
    wn[i] = n
  end
  local count = total
  local allowed, retry, reset = false, 0, 0
  local c = 0 -- the clock member, last in the set
  if clock then c = 1 end
  if mode == REFUND then
    allowed = true
    count = max(total - n, 0)
    if count > 0 then
      -- The newest unit left once the n newest go.
      local m = call('ZRANGE', key, -(n + 1 + c), -(n + 1 + c), 'WITHSCORES')
      reset = tonumber(m[2]) + W - t
    end
    -- A refund of 0 charges nothing but keeps a grown skew, as core's
    -- Commit does for any request that is not charged.
    pending(i, writeKind(total > 0, mode, 'LOG'), key, at, clock, last, at, sk, 0, total > 0 and sk > skew)
    return allowed, max(L - count, 0), retry, reset
  elseif n > L then
    retry = -1
  elseif mode == CHARGE or total + n <= L then
    allowed = true
    count = total + n
  else
    -- Wait until the oldest total+n-L units have expired.
    local need = total + n - L
    local m = call('ZRANGE', key, need - 1, need - 1, 'WITHSCORES')
    retry = tonumber(m[2]) + W - t
  end
  -- For LOG: a = the time to record, b = the clock member to replace,
  -- c = the newest mark, where a grown skew goes if nothing is charged.
  pending(i, 'LOG', key, at, clock, last, at, sk, 0, total > 0 and sk > skew)
  if allowed and n > 0 then
    reset = at + W - t
  elseif total > 0 then
    reset = last + W - t
  end
  return allowed, max(L - count, 0), retry, reset
end

local steps = {[BUCKET] = stepBucketKey, [FIXED] = stepFixed, [SLIDING] = stepSliding, [LOG] = stepLog}

-- keepLogSkew moves the clock member of the sliding log at key to the
-- skew that grew in slot i, scored as its newest mark.
local function keepLogSkew(key, i)
  if wb[i] then call('ZREM', key, wb[i]) end
  call('ZADD', key, fmt(wc[i]), '~' .. fmt(wsk[i]))
end

-- commit writes what a charged request recorded for its nk limits, with
-- each key's expiry at the moment its limit is full again (and as long
-- again as core's Spec.Hold says); string states are written when the
-- batch ends.
local function commit(nk, out, base, extra)
  for i = 1, nk do
    local n = wn[i]
    local ttl = floor((out[base + 4 * i] + whold[i] + 999) / 1000) + extra
    if ttl < 1 then ttl = 1 end
    local key = wkey[i]
    if wkind[i] == 'NONE' then
      -- a refund on a key that holds nothing
    elseif wkind[i] == 'SET' then
      if ttls[key] == nil then dirty[#dirty + 1] = key end
      local v = states[key]
      if v then
        v[1], v[2], v[3], v[4], v[5] = wa[i], wb[i], wc[i], wt[i], wsk[i] -- no garbage for a hot key
      else
        states[key] = {wa[i], wb[i], wc[i], wt[i], wsk[i]}
      end
      ttls[key] = ttl
    elseif wmode == REFUND then
      refundLog(key, n, wb[i])
    elseif n == 0 then
      -- a forced charge on a full log (see stepLog): no charge, but a
      -- grown skew is kept, as keepSkews does
      if wgrew[i] then keepLogSkew(key, i) end
    else
      if wb[i] then call('ZREM', key, wb[i]) end
      -- n members at time t, named t:j, after those already at t. A name
      -- may be taken all the same: members of one time rank by name, and
      -- a refund drops the last ranked (refundLog), which of ten or more
      -- (t:9 after t:10) is not the latest named. So each ZADD adds only
      -- names not taken (NX), and the units it could not add go on under
      -- the names after, until all n are in: a name taken twice would
      -- count one unit for two, and admit one too many.
      local ts = fmt(wa[i])
      local j, left = call('ZCOUNT', key, ts, ts), n
      while left > 0 do
        local args = {'NX'}
        for _ = 1, min(left, 500) do
          j = j + 1
          args[#args + 1] = ts
          args[#args + 1] = ts .. ':' .. fmt(j)
        end
        left = left - call('ZADD', key, unpack(args))
      end
      if wsk[i] > 0 then call('ZADD', key, ts, '~' .. fmt(wsk[i])) end
      call('PEXPIRE', key, ttl)
    end
  end
end

-- keepSkews records the skews that grew for the nk limits of a request
-- that is not charged.
local function keepSkews(nk)
  for i = 1, nk do
    if wgrew[i] then
      local key = wkey[i]
      if wkind[i] == 'SET' then
        keepSkew(key, wsk[i])
      else
        keepLogSkew(key, i)
      end
    end
  end
end

-- fail drops what a failed request appended to out after base, and
-- returns err.
local function fail(out, base, err)
  for j = #out, base + 1, -1 do out[j] = nil end
  return err
end

-- decide decides one request of cost n at now against the nk limits whose
-- keys follow KEYS[k0] (then the key's override key) and whose specs are
-- specs[ARGV[a0 + i]], or, when
-- the key has an override, against the override's limits; appends its
-- results to out (after "=" and the override's value, for an override),
-- and charges it if every limit allows it. It returns nil, the number of
-- limits decided and the index in out before their results; or an error
-- reply (and appends nothing).
local function decide(specs, k0, nk, n, now, a0, out, extra, mode)
  local b0 = #out
  local ov, oerr = lookupOverride(KEYS[k0 + nk + 1], now, k0, nk)
  if ov == nil then return oerr end
  local base = b0
  if ov then
    nk = #ov.specs
    out[b0 + 1] = '=' .. ov.raw
    base = b0 + 1
  end
  local allowedAll = true
  for i = 1, nk do
    local sp, key
    if ov then
      sp, key = ov.specs[i], ov.keys[i]
    else
      sp, key = specs[num(ARGV[a0 + i])], KEYS[k0 + i]
    end
    local step = steps[sp.kind]
    if not step then
      return fail(out, b0, redis.error_reply('FLOODGATE unknown limit kind ' .. tostring(sp.kind)))
    end
    if sp.kind == LOG and sp.quota > MAXLOG then
      -- an override written before the bound: deciding on it could take
      -- unbounded work; setting or deleting it still works
      return fail(out, b0, redis.error_reply('FLOODGATE sliding log limit ' .. fmt(sp.quota) ..
        ' is over the maximum ' .. MAXLOG .. ' on key ' .. key .. '; replace or delete its override'))
    end
    wkind[i] = false
    local ni = n
    if mode ~= TAKE then ni = min(n, sp.quota) end -- at most the quota, as core's Charge and Refund
    wn[i] = ni
    local allowed, remaining, retry, reset = step(sp, key, now, ni, i, mode)
    if allowed == nil then return fail(out, b0, remaining) end
    if n == 0 then allowed, retry = true, 0 end
    if not allowed then allowedAll = false end
    out[base + 4 * i - 3] = allowed and 1 or 0
    out[base + 4 * i - 2] = remaining
    out[base + 4 * i - 1] = retry
    out[base + 4 * i] = reset
  end
  wmode = mode
  if allowedAll and n > 0 then
    commit(nk, out, base, extra)
  else
    for i = 1, nk do
      if wgrew[i] then keepSkews(nk); break end
    end
  end
  return nil, nk, base
end

-- readSpec returns the spec packed in ARGV[a+1]. A policy sends the same
-- spec with every batch, so the parsed specs are kept by their packed
-- value (a library keeps them from one call to the next, at most
-- SPECS_MAX of them), and are never changed once made.
local specCache, nspecCache, SPECS_MAX = {}, 0, 1024
local function readSpec(a)
  local raw = ARGV[a + 1]
  local sp = specCache[raw]
  if sp then return sp end
  local kind, quota, rate, period, tauQ, tauR, tq, tr, c0, c1, c2 = sunpack('>ddddddddddd', raw)
  sp = {kind = kind, quota = quota, rate = rate, period = period, tauQ = tauQ, tauR = tauR,
    tq = tq, tr = tr, c0 = c0, c1 = c1, c2 = c2}
  if nspecCache >= SPECS_MAX then specCache, nspecCache = {}, 0 end
  specCache[raw], nspecCache = sp, nspecCache + 1
  return sp
end


-- serverNow returns now, or for -1 the server's TIME.
local function serverNow(now)
  if now >= 0 then return now end
  if not servernow then servernow = timeMicros() end
  return servernow
end

-- readRequest reads the request whose arguments follow ARGV[a]: its
-- number of limits, cost, time (the server's for -1) and mode, and
-- whether it is advisory.
local function readRequest(a)
  local nk, advisory = num(ARGV[a + 1]), false
  if not nk then nk, advisory = tonumber(sub(ARGV[a + 1], 2)), true end -- "a<nk>"
  local n, now = num(ARGV[a + 2]), num(ARGV[a + 3])
  local mode = TAKE
  if not n then
    mode, n = REFUND, tonumber(sub(ARGV[a + 2], 2)) -- "r<n>"
  elseif n < 0 then
    mode, n = CHARGE, -n
  end
  return nk, n, serverNow(now), mode, advisory
end

-- decideGroup is core's Grouper.TakeGroup: it decides the count requests
-- whose arguments follow ARGV[a], in order, each as a request of its own
-- (a request sees what earlier ones charged), and, when all is set and a
-- request that is not advisory was denied, gives back what the others
-- charged, the latest first, at the same instant, marking their results
-- undone (allowed = 2). A request that fails gives back what the group
-- charged and fails the group: its results are then the one error. It
-- returns the next k0 and a, and nil or the error reply.
local function decideGroup(k0, a, count, all, out)
  local base = #out
  local done, undo, err = {}, false, nil
  for _ = 1, count do
    local nk, n, now, mode, advisory = readRequest(a)
    if not err then
      local count, ob
      err, count, ob = decide(specs, k0, nk, n, now, a + 3, out, extra, mode)
      if not err then
        local allowed = true
        for i = 1, count do
          if out[ob + 4 * i - 3] == 0 then allowed = false end
        end
        if not allowed and not advisory then undo = true end
        done[#done + 1] = {k0 = k0, nk = nk, n = n, now = now, a0 = a + 3, charged = allowed and n > 0 and mode ~= REFUND, ob = ob, count = count}
      end
    end
    k0, a = k0 + nk + 1, a + 3 + nk
  end
  if err then undo = true end
  if (all or err) and undo then
    for j = #done, 1, -1 do
      local m = done[j]
      if m.charged then
        local back = {}
        local _, _, bb = decide(specs, m.k0, m.nk, m.n, m.now, m.a0, back, extra, REFUND)
        for i = 1, m.count do
          out[m.ob + 4 * i - 3] = 2
          for x = 2, 4 do out[m.ob + 4 * i - 4 + x] = back[bb + 4 * i - 4 + x] end
        end
      end
    end
  end
  if err then fail(out, base, err) end
  return k0, a, err
end

-- makeCarry returns carry (below). It is built only for a batch that
-- sets or deletes an override, so that decisions do not pay for
-- building its functions at every call.
local function makeCarry()
  -- stepOne decides one request of cost n on the limit sp at key and
  -- charges it if it passes (or, for a charge or a refund, always), as
  -- decide does. It returns the limit's remaining, or nil and an error
  -- reply.
  local function stepOne(sp, key, now, n, mode)
    wkind[1], wgrew[1], wn[1] = false, false, n
    local allowed, remaining, retry, reset = steps[sp.kind](sp, key, now, n, 1, mode)
    if allowed == nil then return nil, remaining end
    if n > 0 and allowed then
      wmode = mode
      commit(1, {1, remaining, retry, reset}, 0, extra)
    end
    return remaining
  end

  -- forget deletes the state of the limit sp at key.
  local function forget(sp, key)
    if sp.kind == LOG then call('DEL', key); return end
    if ttls[key] == nil then dirty[#dirty + 1] = key end
    states[key], ttls[key] = false, 0
  end

  -- core.Strategy, as the item's argument says it.
  local ADDITIVE, AS_IS, PROPORTIONAL, RESET_USAGE = {{ADDITIVE}}, {{AS_IS}}, {{PROPORTIONAL}}, {{RESET_USAGE}}

  -- carryWant is storekit.Carry: how many units a limit of toQuota keeps of an
  -- old limit's fromRemaining of fromQuota under the strategy st.
  local function carryWant(st, fromQuota, fromRemaining, toQuota)
    local want
    if st == PROPORTIONAL then
      want = mulDiv(fromRemaining, toQuota, fromQuota)
    elseif st == ADDITIVE and toQuota >= fromQuota then
      want = fromRemaining + toQuota - fromQuota
    else
      want = fromRemaining
    end
    return min(max(want, 0), toQuota)
  end

  -- carry is core's Overrider.SetOverride: the item "o", strategy, the
  -- override's value ("" deletes it; "<" and limits as an override's
  -- value carries the key from those limits, see Rebase in
  -- override.go), its TTL in ms (0 none; the value
  -- then records when it expires, on the decisions' time line), now, and
  -- the Policy's nb limits (its keys follow KEYS[k0], then the key's
  -- override key and limit 0's keys as a bucket and as a fixed window,
  -- "<prefix>{key}:0b" and "…:0f", for markOverridden). It sets or deletes the
  -- override and moves the key's usage from its old limits to its new ones
  -- as the strategy says, in the steps storekit.Carry describes: it peeks each
  -- old limit and the new one, charges what is above the target, or
  -- refunds what is below it and, if that falls short, starts the limit
  -- afresh and charges what the target leaves out; then it deletes the
  -- states the new limits do not use, as the memory store does. It returns
  -- nil or an error reply.
  local function carry(k0, a, nb)
    local st, raw, ttl = tonumber(ARGV[a + 2]), ARGV[a + 3], tonumber(ARGV[a + 4])
    local rebase = sub(raw, 1, 1) == '<'
    local now = serverNow(tonumber(ARGV[a + 5]))
    local base = {specs = {}, keys = {}}
    for i = 1, nb do base.specs[i], base.keys[i] = specs[tonumber(ARGV[a + 6 + i])], KEYS[k0 + i] end
    local okey = KEYS[k0 + nb + 1]
    local from, err = lookupOverride(okey, now, k0, nb)
    if from == nil then
      if rebase and sub(err.err, 1, 1) == '?' then
        -- The key is overridden all the same, and keeps it.
        return redis.error_reply('FLOODGATE overridden')
      end
      return err
    end
    local to = base
    if rebase then
      -- Rebaser.Rebase: from the old limits "<"..raw to the Policy's,
      -- unless an override decides the key.
      if from then return redis.error_reply('FLOODGATE overridden') end
      from = parseOverride(sub(raw, 2), okey)
      if not from then return redis.error_reply('FLOODGATE invalid limits ' .. raw) end
      if undeclared(from.keys, k0, nb) then return undeclaredReply(okey, sub(raw, 2)) end
    else
      if not from then from = base end
      if raw ~= '' then
        if ttl > 0 then raw = 'fg1@' .. fmt(now + ttl * 1000) .. sub(raw, 4) end
        to = parseOverride(raw, okey)
        if not to then return redis.error_reply('FLOODGATE invalid override ' .. raw) end
        if undeclared(to.keys, k0, nb) then return undeclaredReply(okey, raw) end
      end
    end
    -- Every state is read before anything is written, so that a corrupt
    -- one fails the call with nothing changed. The old limits are read
    -- first and what they leave is kept: a sliding log's peek drops the
    -- marks its own window has expired, so a new log of a shorter period
    -- on the same key would drop marks the old one still counts.
    local left = {}
    for i = 1, #from.specs do
      local r, e = stepOne(from.specs[i], from.keys[i], now, 0, TAKE)
      if r == nil then return e end
      left[i] = r
    end
    for i = 1, #to.specs do
      local r, e = stepOne(to.specs[i], to.keys[i], now, 0, TAKE)
      if r == nil then return e end
    end
    if rebase then
      -- the override key is not touched
    elseif raw ~= '' then
      -- Redis's own expiry only cleans up: the time line decides.
      if ttl > 0 then call('SET', okey, raw, 'PX', ttl + extra) else call('SET', okey, raw) end
      -- The fast path's states of the key must look for it now.
      markOverridden(KEYS[k0 + nb + 2], KEYS[k0 + nb + 3])
    else
      call('DEL', okey)
    end
    local keep = {}
    if st ~= RESET_USAGE then
      for i = 1, #to.specs do
        keep[to.keys[i]] = true
        if from.specs[i] then
          local want = carryWant(st, from.specs[i].quota, left[i], to.specs[i].quota)
          local sp, key = to.specs[i], to.keys[i]
          local f = from.specs[i]
          if key ~= from.keys[i] then
            forget(f, from.keys[i])
          elseif sp.kind ~= BUCKET and (f.period ~= sp.period or (f.c1 == 0) ~= (sp.c1 == 0)) then
            forget(sp, key) -- windows of another shape start afresh, as core's sameShape
          end
          local rt, e2 = stepOne(sp, key, now, 0, TAKE)
          if rt == nil then return e2 end
          if rt < want then
            stepOne(sp, key, now, want - rt, REFUND)
            rt = stepOne(sp, key, now, 0, TAKE)
            if rt < want then
              -- The refund fell short: start afresh.
              forget(sp, key)
              rt = sp.quota
            end
          end
          if rt > want then stepOne(sp, key, now, rt - want, CHARGE) end
        end
      end
    end
    for i = 1, #from.specs do
      if not keep[from.keys[i]] then forget(from.specs[i], from.keys[i]) end
    end
    for i = 1, #to.specs do
      if not keep[to.keys[i]] then forget(to.specs[i], to.keys[i]) end
    end
    if rebase then return nil end
    if raw ~= '' then overrides[okey] = to else overrides[okey] = false end
    return nil
  end
  return carry
end

-- integers makes the numbers of out integers, on Lua 5.4 (toint), where
-- arithmetic on struct's doubles gives floats, which a server would
-- answer as doubles rather than as Redis's integers. Every one of them
-- is a whole number.
local function integers(out)
  for i = 1, #out do
    local v = out[i]
    if type(v) == 'number' then out[i] = toint(v) end
  end
end

-- decideBatch decides one call: its items, in order (see the top of this
-- file), and then writes the string states they changed.
local function decideBatch(keys, argv)
  KEYS, ARGV = keys, argv
  states, ttls, dirty, overrides, servernow, keySet = {}, {}, {}, {}, nil, nil
  extra = tonumber(ARGV[1])
  local nspecs = tonumber(ARGV[2])
  specs = {}
  for j = 1, nspecs do specs[j] = readSpec(1 + j) end -- one argument each
  local out = {}
  local k0, a = 0, 3 + nspecs
  for _ = 1, tonumber(ARGV[3 + nspecs]) do
    local head, err = sub(ARGV[a + 1], 1, 1), nil
    if head == 'g' or head == 'G' then
      k0, a, err = decideGroup(k0, a + 1, tonumber(sub(ARGV[a + 1], 2)), head == 'G', out)
    elseif head == 'o' then
      local nb = tonumber(ARGV[a + 6])
      err = makeCarry()(k0, a, nb)
      k0, a = k0 + nb + 3, a + 6 + nb
    else
      local nk, n, now, mode = readRequest(a)
      err = decide(specs, k0, nk, n, now, a + 3, out, extra, mode)
      k0, a = k0 + nk + 1, a + 3 + nk
    end
    if err then out[#out + 1] = err.err end
  end
  for _, key in ipairs(dirty) do
    local v = states[key]
    if not v then
      call('DEL', key) -- forgotten (see forget)
    else
      -- The key's last letter is its limit's kind (see suffixOf).
      local value, kind = nil, byte(key, -1)
      if kind == BUCKET_LETTER then
        value = fmtBucket(v[1], v[2], v[3], v[4], v[5], 0, false)
      elseif kind == FIXED_LETTER then
        value = fmtFixed(v[1], v[2], v[3], v[4], v[5], false)
      else
        value = fmt5(v[1], v[2], v[3], v[4], v[5])
      end
      if ttls[key] then call('SET', key, value, 'PX', ttls[key]) else call('SET', key, value, 'KEEPTTL') end
    end
  end
  if toint then integers(out) end
  return out
end
