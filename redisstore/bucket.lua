-- floodgate: the fast path for the commonest decision, one request
-- against one bucket limit (token bucket, leaky bucket, GCRA), sent alone.
-- It decides exactly as decide.lua's kind 1 and reads and writes the same
-- state, "tat:fraction:rate"; the conformance suite and the differential
-- fuzz test run through it. It exists because a lone decision costs Redis
-- about a third of the instructions that decide.lua's general batch
-- machinery does, and that is the latency of a single caller.
-- (prelude.lua comes first.)
--
-- KEYS[1]  the bucket's state
-- ARGV     now in µs (or -1 for the server's TIME), the cost n (0 peeks),
--          milliseconds added to the expiry, quota, rate, period (µs)
-- Returns allowed (0/1), remaining, retry (µs, -1 never), reset (µs).

local key = KEYS[1]
local now, n, extra = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local L, R, P = tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6])
if now < 0 then
  local t = call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
end
local tauQ, tauR = muldiv(L, P, R)

local tat, f = 0, 0
local raw = rpcall('GET', key)
if type(raw) == 'table' and raw.err then return wrongtype(key) end
if raw then
  local x, y, z = match(raw, '^(%d+):(%d+):(%d+)$')
  if not x then return corrupt(key) end
  tat, f = tonumber(x), tonumber(y)
  if tonumber(z) ~= R then
    if f > 0 then tat = tat + 1 end
    f = 0
  end
end
if tat < now then tat, f = now, 0 end

local allowed, remaining, retry, reset = false, 0, 0, 0
if n > L then
  retry = -1
else
  local iq, ir = muldiv(n, P, R)
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
  local q, r = muldiv(dt, R, P)
  remaining = q + floor((r + df) / P)
end
if tat > now or (tat == now and f > 0) then
  reset = tat - now
  if f > 0 then reset = reset + 1 end
end
if n == 0 then allowed, retry = true, 0 end

if allowed and n > 0 then
  local ttl = floor((reset + 999) / 1000) + extra
  if ttl < 1 then ttl = 1 end
  call('SET', key, fmt3(tat, f, R), 'PX', ttl)
end
return {allowed and 1 or 0, remaining, retry, reset}
