-- floodgate: decide a batch of requests, each against one or more limits,
-- each atomically, one after the other, exactly as if each had been a
-- script call of its own.
--
-- The algorithms mirror package core (core/algo.go): stepBucket (in
-- prelude.lua), stepFixed, stepSliding, stepLog and slidingAllowAt have
-- the names, the steps and the rounding of the Go functions; change both
-- together. The conformance suite and the differential fuzz test hold
-- them to identical results.
--
-- KEYS     the keys of every request in order: for each, the state of its
--          limit i (a string, or a sorted set for a sliding log)
-- ARGV[1]  milliseconds added to every expiry (0 with server time)
-- ARGV[2]  the number of distinct limits (specs) that follow, 11 values
--          each, read by readSpec into fields of the same names: kind,
--          quota, rate, period, tauQ, tauR, tq, tr, c0, c1, c2
--   kind: 1 bucket, 2 fixed window, 3 sliding window counter, 4 sliding log
--   tau = quota*period/rate = tauQ + tauR/rate and T = period/rate =
--   tq + tr/rate (µs), for a bucket; the client works them out exactly.
--   c0, c1, c2: for a calendar window, [c0, c1) is the window that
--   contains the client's now and [c1, c2) the next one (Lua has no time
--   zones, so the client computes them); 0 for every other limit.
-- then the number of requests, and for each: its number of limits nk, the
-- cost n (n = 0 peeks), now in microseconds (or -1 for the server's TIME),
-- and the nk indexes (from 1) of its limits' specs.
-- Returns, for each request in order, 4 integers per limit: allowed (0/1),
-- remaining, retry (µs, -1 never), reset (µs); or, for a request whose
-- state is not floodgate's, one string: the error. Other requests of the
-- batch are unaffected.
--
-- Every number stays below 2^53, so Lua's doubles hold it exactly.

-- (prelude.lua comes first: mulDiv, stepBucket, fmt, fmt3, parseBucket,
-- fmtBucket, corrupt, wrongType; then a call of init().)

local BUCKET, FIXED, SLIDING, LOG = 1, 2, 3, 4

-- The string states that this batch has read or written, by key, parsed
-- into their three numbers (false for a missing key), and the writes to
-- make when the batch ends, so that a key decided many times in one batch
-- (a hot key) is read once and written once. Each write is the key's last
-- state with the expiry its last decision gave it, exactly as one call per
-- decision would leave it.
local states, ttls, dirty = {}, {}, {}

-- The string keys that hold buckets, which are written by fmtBucket.
local buckets = {}

-- readState reads a string key holding three integers, which parse reads
-- from its value. It returns found, a, b, c (false, 0, 0, 0 for a missing
-- key), or nil and an error reply for a key of another type or content.
local function readState(key, parse)
  local v = states[key]
  if v == nil then
    local raw = rpcall('GET', key)
    if type(raw) == 'table' and raw.err then return nil, wrongType(key) end
    v = false
    if raw then
      local x, y, z = parse(raw)
      if not x then return nil, corrupt(key) end
      v = {x, y, z}
    end
    states[key] = v
  end
  if not v then return false, 0, 0, 0 end
  return true, v[1], v[2], v[3]
end

-- The windows' states, "a:b:c": see stepFixed and stepSliding.
local function parseFixed(raw)
  local x, y, z = match(raw, '^(%-?%d+):(%-?%d+):(%d+)$')
  if x then return tonumber(x), tonumber(y), tonumber(z) end
end

local function parseSliding(raw)
  local x, y, z = match(raw, '^(%-?%d+):(%d+):(%d+)$')
  if x then return tonumber(x), tonumber(y), tonumber(z) end
end

-- What a request writes if charged, per limit: kind ('SET' or 'LOG'), key
-- and values. Reused by every request.
local wkind, wkey, wa, wb, wc = {}, {}, {}, {}, {}

local function pending(i, kind, key, a, b, c)
  wkind[i], wkey[i], wa[i], wb[i], wc[i] = kind, key, a, b, c
end

-- window is core's Spec.Window: the fixed window [start, end) that
-- contains t, epoch-aligned, or for a calendar window the one the client
-- named.
local function window(sp, t)
  if sp.c1 == 0 then
    local off = t % sp.period
    return t - off, t - off + sp.period
  end
  if t < sp.c1 then return sp.c0, sp.c1 end
  return sp.c1, sp.c2
end

-- Each step function decides a request of cost n at now against the limit
-- sp whose state is at key, records in slot i what to write if the
-- request is charged, and returns allowed, remaining, retry (-1 never) and
-- reset, or nil and an error reply.

local function stepBucketKey(sp, key, now, n, i)
  local found, tat, f, sr = readState(key, parseBucket)
  if found == nil then return nil, tat end
  buckets[key] = true
  local iq, ir = sp.tq, sp.tr -- n*T for the common n = 1
  if n ~= 1 then iq, ir = mulDiv(n, sp.period, sp.rate) end
  local allowed, remaining, retry, reset
  allowed, tat, f, remaining, retry, reset = stepBucket(tat, f, sr, now, n, sp.quota, sp.rate, sp.period, sp.tauQ, sp.tauR, iq, ir)
  if allowed then pending(i, 'SET', key, tat, f, sp.rate) end
  return allowed, remaining, retry, reset
end

-- stepFixed is the fixed window counter. Its state is "start:end:count".
-- A window that starts after now (the clock went back) stays the current
-- one, as in Go; its end is stored because a calendar window's end cannot
-- be computed here.
local function stepFixed(sp, key, now, n, i)
  local found, s, se, count = readState(key, parseFixed)
  if found == nil then return nil, s end
  local L = sp.quota
  local start, stop
  if found and s >= now then
    start, stop = s, se
  else
    start, stop = window(sp, now)
  end
  if s ~= start then count = 0 end
  local allowed, retry, reset = false, 0, 0
  if n > L then
    retry = -1
  elseif count + n <= L then
    allowed = true
    count = count + n
    pending(i, 'SET', key, start, stop, count)
  else
    retry = stop - now
  end
  if count > 0 then reset = stop - now end
  return allowed, max(L - count, 0), retry, reset
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
local function stepSliding(sp, key, now, n, i)
  local found, s, sprev, scurr = readState(key, parseSliding)
  if found == nil then return nil, s end
  local W, L = sp.period, sp.quota
  local t = max(now, s)
  local e = t % W
  local cur = t - e
  local prev, curr = 0, 0
  if s == cur then prev, curr = sprev, scurr elseif s == cur - W then prev = scurr end
  local q, r = mulDiv(prev, W - e, W)
  local est = q
  if r > 0 then est = est + 1 end
  local allowed, retry, reset = false, 0, 0
  if n > L then
    retry = -1
  elseif est + curr + n <= L then
    allowed = true
    curr = curr + n
    pending(i, 'SET', key, cur, prev, curr)
  else
    retry = slidingAllowAt(cur, W, L, prev, curr, n) - now
  end
  if curr > 0 then reset = cur + 2 * W - now elseif est > 0 then reset = cur + W - now end
  return allowed, max(L - est - curr, 0), retry, reset
end

-- stepLog is the sliding window log: a sorted set with one member per
-- admitted unit, scored by its time. Its time never goes backwards: now is
-- taken as at least the newest mark.
local function stepLog(sp, key, now, n, i)
  local W, L = sp.period, sp.quota
  local newest = rpcall('ZRANGE', key, -1, -1, 'WITHSCORES')
  if newest.err then return nil, wrongType(key) end
  local t = now
  if newest[2] then
    local last = tonumber(newest[2])
    if not last or last ~= floor(last) then return nil, corrupt(key) end
    if last > t then t = last end
  end
  -- Marks at or before t - W have expired.
  call('ZREMRANGEBYSCORE', key, '-inf', fmt(t - W))
  local total = call('ZCARD', key)
  local count = total
  local allowed, retry, reset = false, 0, 0
  if n > L then
    retry = -1
  elseif total + n <= L then
    allowed = true
    count = total + n
    pending(i, 'LOG', key, t)
  else
    -- Wait until the oldest total+n-L units have expired.
    local need = total + n - L
    local m = call('ZRANGE', key, need - 1, need - 1, 'WITHSCORES')
    retry = tonumber(m[2]) + W - now
  end
  if allowed and n > 0 then
    reset = t + W - now
  elseif total > 0 then
    local m = call('ZRANGE', key, -1, -1, 'WITHSCORES')
    reset = tonumber(m[2]) + W - now
  end
  return allowed, max(L - count, 0), retry, reset
end

local steps = {[BUCKET] = stepBucketKey, [FIXED] = stepFixed, [SLIDING] = stepSliding, [LOG] = stepLog}

-- commit writes what a charged request recorded for its nk limits, with
-- each key's expiry at the moment its limit is full again; string states
-- are written when the batch ends.
local function commit(nk, n, out, base, extra)
  for i = 1, nk do
    local ttl = floor((out[base + 4 * i] + 999) / 1000) + extra
    if ttl < 1 then ttl = 1 end
    local key = wkey[i]
    if wkind[i] == 'SET' then
      if not ttls[key] then dirty[#dirty + 1] = key end
      states[key], ttls[key] = {wa[i], wb[i], wc[i]}, ttl
    else
      -- n members at time t, named t:j, after those already at t.
      local ts = fmt(wa[i])
      local have = call('ZCOUNT', key, ts, ts)
      local args, j = {}, 0
      while j < n do
        j = j + 1
        args[#args + 1] = ts
        args[#args + 1] = ts .. ':' .. fmt(have + j)
        if #args >= 1000 or j == n then
          call('ZADD', key, unpack(args))
          args = {}
        end
      end
      call('PEXPIRE', key, ttl)
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
-- keys follow KEYS[k0] and whose specs are specs[ARGV[a0 + i]], appends
-- its results to out, and charges it if every limit allows it. It returns
-- nil, or an error reply (and appends nothing).
local function decide(specs, k0, nk, n, now, a0, out, extra)
  local base = #out
  local allowedAll = true
  for i = 1, nk do
    local sp = specs[tonumber(ARGV[a0 + i])]
    local step = steps[sp.kind]
    if not step then
      return fail(out, base, redis.error_reply('FLOODGATE unknown limit kind ' .. tostring(sp.kind)))
    end
    wkind[i] = false
    local allowed, remaining, retry, reset = step(sp, KEYS[k0 + i], now, n, i)
    if allowed == nil then return fail(out, base, remaining) end
    if n == 0 then allowed, retry = true, 0 end
    if not allowed then allowedAll = false end
    out[base + 4 * i - 3] = allowed and 1 or 0
    out[base + 4 * i - 2] = remaining
    out[base + 4 * i - 1] = retry
    out[base + 4 * i] = reset
  end
  if allowedAll and n > 0 then commit(nk, n, out, base, extra) end
  return nil
end

-- readSpec reads the 11 values of a spec from ARGV[a+1..a+11].
local function readSpec(a)
  return {
    kind = tonumber(ARGV[a + 1]), quota = tonumber(ARGV[a + 2]), rate = tonumber(ARGV[a + 3]),
    period = tonumber(ARGV[a + 4]), tauQ = tonumber(ARGV[a + 5]), tauR = tonumber(ARGV[a + 6]),
    tq = tonumber(ARGV[a + 7]), tr = tonumber(ARGV[a + 8]),
    c0 = tonumber(ARGV[a + 9]), c1 = tonumber(ARGV[a + 10]), c2 = tonumber(ARGV[a + 11]),
  }
end

local SPEC_LEN = 11
local extra = tonumber(ARGV[1])
local nspecs = tonumber(ARGV[2])
local specs = {}
for j = 1, nspecs do specs[j] = readSpec(2 + (j - 1) * SPEC_LEN) end

local servernow -- the server's TIME in µs, read once per batch
local out = {}
local k0, a = 0, 3 + SPEC_LEN * nspecs
for r = 1, tonumber(ARGV[3 + SPEC_LEN * nspecs]) do
  local nk, n, now = tonumber(ARGV[a + 1]), tonumber(ARGV[a + 2]), tonumber(ARGV[a + 3])
  if now < 0 then
    if not servernow then
      local t = call('TIME')
      servernow = tonumber(t[1]) * 1000000 + tonumber(t[2])
    end
    now = servernow
  end
  local err = decide(specs, k0, nk, n, now, a + 3, out, extra)
  if err then out[#out + 1] = err.err end
  k0 = k0 + nk
  a = a + 3 + nk
end
for _, key in ipairs(dirty) do
  local v = states[key]
  local value
  if buckets[key] then value = fmtBucket(v[1], v[2], v[3]) else value = fmt3(v[1], v[2], v[3]) end
  call('SET', key, value, 'PX', ttls[key])
end
return out
