-- floodgate: what decide.lua and bucket.lua share. The Go code prepends
-- this file to each of them, so each script is one chunk for EVALSHA, and
-- to bucket.lua wrapped in a function for the Redis function library
-- (FUNCTION LOAD, FCALL), whose chunk runs once, at load time.
-- Every number stays below 2^53, so Lua's doubles hold it exactly.

local TWO53 = 9007199254740992
-- Globals read once: a global is a table lookup at every use. A library
-- is loaded where only the redis table exists, so init binds them at the
-- first call (a script calls it first thing).
local floor, max, min, format, match, tonumber, sunpack, call, rpcall
local function init()
  floor, max, min, format, match = math.floor, math.max, math.min, string.format, string.match
  tonumber, sunpack, call, rpcall = _G.tonumber, struct.unpack, redis.call, redis.pcall
end

-- mulDiv is core.MulDiv: floor(a*b/c) and remainder, exactly, for
-- 0 <= a, b and 0 < c < 2^52.
local function mulDiv(a, b, c)
  local p = a * b
  if p < TWO53 then
    local q = floor(p / c)
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
-- and n*T = iq + ir/R the request's cost in time. It returns whether the
-- request passes, the TAT to store if it does (tat, f), and remaining,
-- retry (-1 never) and reset.
local function stepBucket(tat, f, sr, now, n, L, R, P, tauQ, tauR, iq, ir)
  if sr ~= R then
    -- The rate changed: the fraction is in other units; round up, drop it.
    if f > 0 then tat = tat + 1 end
    f = 0
  end
  if tat < now then tat, f = now, 0 end
  local allowed, remaining, retry, reset = false, 0, 0, 0
  if n > L then
    retry = -1
  else
    local nt, nf = tat + iq, f + ir
    if nf >= R then nt, nf = nt + 1, nf - R end
    local lt, lf = now + tauQ, tauR
    if nt < lt or (nt == lt and nf <= lf) then
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
    remaining = q + floor((r + df) / P)
  end
  if tat > now or (tat == now and f > 0) then
    reset = tat - now
    if f > 0 then reset = reset + 1 end
  end
  return allowed, tat, f, remaining, retry, reset
end

local function fmt(x) return format('%d', x) end
local function fmt3(a, b, c) return format('%d:%d:%d', a, b, c) end

-- A bucket's state is its TAT in µs, "tat", or, when the TAT has a
-- fraction f/R of a µs (a rate that does not divide its period evenly),
-- "tat:f:R". parseBucket returns tat, f, R (0, 0 in the short form), or
-- nil for anything else; fmtBucket writes the shorter form that holds.
local function parseBucket(raw)
  if match(raw, '^%d+$') then return tonumber(raw), 0, 0 end
  local x, y, z = match(raw, '^(%d+):(%d+):(%d+)$')
  if x then return tonumber(x), tonumber(y), tonumber(z) end
end

local function fmtBucket(tat, f, R)
  if f == 0 then return fmt(tat) end
  return fmt3(tat, f, R)
end

local function corrupt(key)
  return redis.error_reply('FLOODGATE corrupt state: key ' .. key .. ' does not hold floodgate data')
end

local function wrongType(key)
  return redis.error_reply('FLOODGATE wrong type: key ' .. key .. ' holds a value that is not floodgate state')
end
