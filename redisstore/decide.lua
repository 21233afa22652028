-- floodgate: decide a batch of requests, each against one or more limits,
-- each atomically, one after the other, exactly as if each had been a
-- script call of its own.
-- A line-for-line mirror of algo.go: change both together; the conformance
-- suite and the differential fuzz test hold them to identical results.
--
-- KEYS     the keys of every request in order: for each, the state of its
--          limit i (a string, or a sorted set for a sliding log)
-- ARGV[1]  milliseconds added to every expiry (0 with server time)
-- ARGV[2]  the number of distinct limits (specs) that follow, 7 values
--          each: kind, quota, rate, period, c0, c1, c2
--   kind: 1 bucket, 2 fixed window, 3 sliding window counter, 4 sliding log
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

-- (prelude.lua comes first: muldiv, bucket, fmt, fmt3, parsebucket,
-- fmtbucket, corrupt, wrongtype; then a call of init().)

-- The string states that this batch has read or written, by key, parsed
-- into their three numbers (false for a missing key), and the writes to
-- make when the batch ends, so
-- that a key decided many times in one batch (a hot key) is read once
-- and written once. Each write is the key's last state with the expiry
-- its last decision gave it, exactly as one call per decision would leave
-- it.
local states, ttls, dirty = {}, {}, {}

-- read3 reads a string key holding three integers, which parse reads
-- from its value. It returns found, a, b, c (false, 0, 0, 0 for a missing
-- key), or nil and an error reply for a key of another type or content.
local function read3(key, parse)
  local v = states[key]
  if v == nil then
    local raw = rpcall('GET', key)
    if type(raw) == 'table' and raw.err then return nil, wrongtype(key) end
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

-- The windows' states, "a:b:c": see their kinds below.
local function parsefixed(raw)
  local x, y, z = match(raw, '^(%-?%d+):(%-?%d+):(%d+)$')
  if x then return tonumber(x), tonumber(y), tonumber(z) end
end

local function parsecounter(raw)
  local x, y, z = match(raw, '^(%-?%d+):(%d+):(%d+)$')
  if x then return tonumber(x), tonumber(y), tonumber(z) end
end

-- The string keys that hold buckets, which are written by fmtbucket.
local buckets = {}

local function window(t, period, c0, c1, c2)
  if c1 == 0 then
    local off = t % period
    return t - off, t - off + period
  end
  if t < c1 then return c0, c1 end
  return c1, c2
end

local extra = tonumber(ARGV[1])

-- The specs, parsed once per batch, with what the buckets precompute:
-- the tolerance tau = quota*period/rate and the emission interval T =
-- period/rate, each as a quotient and a remainder.
local specs = {}
local nspecs = tonumber(ARGV[2])
for j = 1, nspecs do
  local a = 2 + (j - 1) * 7
  local sp = {tonumber(ARGV[a + 1]), tonumber(ARGV[a + 2]), tonumber(ARGV[a + 3]), tonumber(ARGV[a + 4]),
    tonumber(ARGV[a + 5]), tonumber(ARGV[a + 6]), tonumber(ARGV[a + 7]), 0, 0, 0, 0}
  if sp[1] == 1 then
    sp[8], sp[9] = muldiv(sp[2], sp[4], sp[3])
    sp[10], sp[11] = muldiv(1, sp[4], sp[3])
  end
  specs[j] = sp
end

-- What a request writes if charged, per limit: kind ('SET' or 'LOG'),
-- key and values. Reused by every request.
local wkind, wkey, wa, wb, wc = {}, {}, {}, {}, {}

-- fail drops what a failed request appended to out, and returns err.
local function fail(out, base, err)
  for j = #out, base + 1, -1 do out[j] = nil end
  return err
end

-- decide decides one request of cost n at now against the nk limits whose
-- keys follow KEYS[k0] and whose spec indexes follow ARGV[a0], and appends
-- its results to out. It returns nil, or an error reply (and appends
-- nothing).
local function decide(k0, nk, n, now, a0, out)
local base = #out
local allowedAll = true

for i = 1, nk do
  local key = KEYS[k0 + i]
  local sp = specs[tonumber(ARGV[a0 + i])]
  local kind, L, R, P, c0, c1, c2 = sp[1], sp[2], sp[3], sp[4], sp[5], sp[6], sp[7]
  local allowed, remaining, retry, reset = false, 0, 0, 0
  wkind[i] = false

  if kind == 1 then
    local found, tat, f, sr = read3(key, parsebucket)
    buckets[key] = true
    if found == nil then return fail(out, base, tat) end
    local iq, ir = sp[10], sp[11]
    if n ~= 1 then iq, ir = muldiv(n, P, R) end
    allowed, tat, f, remaining, retry, reset = bucket(tat, f, sr, now, n, L, R, P, sp[8], sp[9], iq, ir)
    if allowed then
      wkind[i], wkey[i], wa[i], wb[i], wc[i] = 'SET', key, tat, f, R
    end

  elseif kind == 2 then
    -- The state is "start:end:count". A window that starts after now (the
    -- clock went back) stays the current one, as in Go; its end is stored
    -- because a calendar window's end cannot be computed here.
    local found, s, se, count = read3(key, parsefixed)
    if found == nil then return fail(out, base, s) end
    local start, stop
    if found and s >= now then
      start, stop = s, se
    else
      start, stop = window(now, P, c0, c1, c2)
    end
    if s ~= start then count = 0 end
    if n > L then
      retry = -1
    elseif count + n <= L then
      allowed = true
      count = count + n
      wkind[i], wkey[i], wa[i], wb[i], wc[i] = 'SET', key, start, stop, count
    else
      retry = stop - now
    end
    remaining = max(L - count, 0)
    if count > 0 then reset = stop - now end

  elseif kind == 3 then
    local found, s, sp, sc = read3(key, parsecounter)
    if found == nil then return fail(out, base, s) end
    local t = max(now, s)
    local e = t % P
    local cur = t - e
    local prev, curr = 0, 0
    if s == cur then prev, curr = sp, sc elseif s == cur - P then prev = sc end
    local q, r = muldiv(prev, P - e, P)
    local est = q
    if r > 0 then est = est + 1 end
    if n > L then
      retry = -1
    elseif est + curr + n <= L then
      allowed = true
      curr = curr + n
      wkind[i], wkey[i], wa[i], wb[i], wc[i] = 'SET', key, cur, prev, curr
    else
      local need = L - curr - n
      local at
      if need >= 0 then
        local q2 = muldiv(need, P, prev)
        at = cur + P - q2
      else
        local q2 = muldiv(L - n, P, curr)
        at = cur + P + P - min(q2, P)
      end
      retry = at - now
    end
    remaining = max(L - est - curr, 0)
    if curr > 0 then reset = cur + 2 * P - now elseif est > 0 then reset = cur + P - now end

  elseif kind == 4 then
    -- A sorted set with one member per admitted unit, scored by its time.
    local newest = rpcall('ZRANGE', key, -1, -1, 'WITHSCORES')
    if newest.err then return fail(out, base, wrongtype(key)) end
    local t = now
    if newest[2] then
      local last = tonumber(newest[2])
      if not last or last ~= floor(last) then return fail(out, base, corrupt(key)) end
      if last > t then t = last end
    end
    call('ZREMRANGEBYSCORE', key, '-inf', fmt(t - P))
    local total = call('ZCARD', key)
    local count = total
    if n > L then
      retry = -1
    elseif total + n <= L then
      allowed = true
      count = total + n
      wkind[i], wkey[i], wa[i] = 'LOG', key, t
    else
      local need = total + n - L
      local m = call('ZRANGE', key, need - 1, need - 1, 'WITHSCORES')
      retry = tonumber(m[2]) + P - now
    end
    remaining = max(L - count, 0)
    if allowed and n > 0 then
      reset = t + P - now
    elseif total > 0 then
      local m = call('ZRANGE', key, -1, -1, 'WITHSCORES')
      reset = tonumber(m[2]) + P - now
    end
  else
    return fail(out, base, redis.error_reply('FLOODGATE unknown limit kind ' .. tostring(kind)))
  end

  if n == 0 then allowed, retry = true, 0 end
  if not allowed then allowedAll = false end
  out[base + 4 * i - 3] = allowed and 1 or 0
  out[base + 4 * i - 2] = remaining
  out[base + 4 * i - 1] = retry
  out[base + 4 * i] = reset
end

if allowedAll and n > 0 then
  for i = 1, nk do
    local ttl = floor((out[base + 4 * i] + 999) / 1000) + extra
    if ttl < 1 then ttl = 1 end
    local key = wkey[i]
    if wkind[i] == 'SET' then
      if not ttls[key] then dirty[#dirty + 1] = key end
      states[key], ttls[key] = {wa[i], wb[i], wc[i]}, ttl
    else
      -- n members at time t, named t:j, after those already at t.
      local t = wa[i]
      local ts = fmt(t)
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
return nil
end

local servernow -- the server's TIME in µs, read once per batch
local out = {}
local k0, a = 0, 3 + 7 * nspecs
for r = 1, tonumber(ARGV[3 + 7 * nspecs]) do
  local nk, n, now = tonumber(ARGV[a + 1]), tonumber(ARGV[a + 2]), tonumber(ARGV[a + 3])
  if now < 0 then
    if not servernow then
      local t = call('TIME')
      servernow = tonumber(t[1]) * 1000000 + tonumber(t[2])
    end
    now = servernow
  end
  local err = decide(k0, nk, n, now, a + 3, out)
  if err then out[#out + 1] = err.err end
  k0 = k0 + nk
  a = a + 3 + nk
end
for _, key in ipairs(dirty) do
  local v = states[key]
  local value
  if buckets[key] then value = fmtbucket(v[1], v[2], v[3]) else value = fmt3(v[1], v[2], v[3]) end
  call('SET', key, value, 'PX', ttls[key])
end
return out
