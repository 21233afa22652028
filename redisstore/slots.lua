-- floodgate: concurrency limits (slots), core.SlotSpec.Step in Lua.
-- A key's slots are a sorted set, <prefix>{key}:c, of its permits: the
-- member is the permit's id, the score its expiry in µs. Every number
-- stays below 2^53, so Lua's doubles (and a sorted set's scores) hold it
-- exactly. A name in double braces is one of Go's constants
-- (slotLuaConstants in concurrency.go).
--
-- KEYS[i] is op i's key. ARGV[1] is now in µs, or -1 for Redis's TIME;
-- ARGV[2] the ms a key outlives its latest permit (more when the time is
-- not Redis's). Then 4 arguments per op: its kind, N, the lease in µs,
-- the permit id. The reply has 3 elements per op: 1 (done) or 0 (not
-- done, changing nothing), or an error string for a key that is not a
-- sorted set or a duplicate acquire; the permits live after it; and the
-- permit's expiry (acquire, extend) or, for a denied acquire, the µs
-- until the earliest expiry, else 0.
--
-- Each op does O(log N) work plus the permits that expired, each of which
-- was added once: at most N live members per key bound every call.
local ACQUIRE, RELEASE, EXTEND = {{SLOT_ACQUIRE}}, {{SLOT_RELEASE}}, {{SLOT_EXTEND}}
local call, rpcall, tonumber, type = redis.call, redis.pcall, tonumber, type
-- Redis 7 takes PEXPIRE's GT, which makes keep one command.
local GT = (redis.REDIS_VERSION_NUM or 0) >= 0x070000

local now = tonumber(ARGV[1])
if now < 0 then
  local t = call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
end
local extra = tonumber(ARGV[2])

-- keep makes k live at least until expiry: its TTL only grows, since
-- another limit on the key may have a longer lease. A fresh key has no
-- TTL yet, which GT takes for an infinite one. Before Redis 7 the TTL is
-- set when expiry is the key's latest (floodgate's ACL has no PTTL).
local function keep(k, expiry, fresh)
  local ms = math.ceil((expiry - now) / 1000) + extra
  if fresh then
    call('PEXPIRE', k, ms)
  elseif GT then
    call('PEXPIRE', k, ms, 'GT')
  elseif tonumber(call('ZRANGE', k, -1, -1, 'WITHSCORES')[2]) <= expiry then
    call('PEXPIRE', k, ms)
  end
end

local out = {}
for i = 1, #KEYS do
  local k, a = KEYS[i], 2 + (i - 1) * 4
  local kind, n, lease, id = ARGV[a + 1], tonumber(ARGV[a + 2]), tonumber(ARGV[a + 3]), ARGV[a + 4]
  local o = #out
  -- Permits live for [acquired, expiry): drop those at or before now.
  local r = rpcall('ZREMRANGEBYSCORE', k, '-inf', now)
  if type(r) == 'table' and r.err then
    out[o + 1], out[o + 2], out[o + 3] = 'FLOODGATE wrong type: ' .. k .. ' is not a set of permits', 0, 0
  elseif kind == ACQUIRE then
    local held = call('ZCARD', k)
    if held < n then
      local expiry = now + lease
      if call('ZADD', k, 'NX', expiry, id) == 0 then
        out[o + 1], out[o + 2], out[o + 3] = 'FLOODGATE permit held already', held, 0
      else
        keep(k, expiry, held == 0)
        out[o + 1], out[o + 2], out[o + 3] = 1, held + 1, expiry
      end
    elseif call('ZADD', k, 'XX', 'INCR', 0, id) then
      -- A full key that holds the id already: an error, as Step's
      -- duplicate acquire is whether or not the key has room (ZADD XX
      -- INCR 0 is ZSCORE within floodgate's ACL).
      out[o + 1], out[o + 2], out[o + 3] = 'FLOODGATE permit held already', held, 0
    else
      local first = call('ZRANGE', k, 0, 0, 'WITHSCORES')
      out[o + 1], out[o + 2], out[o + 3] = 0, held, tonumber(first[2]) - now
    end
  elseif kind == RELEASE then
    local done = call('ZREM', k, id)
    out[o + 1], out[o + 2], out[o + 3] = done, call('ZCARD', k), 0
  else -- EXTEND
    -- ZADD XX INCR 0 is ZSCORE within floodgate's ACL: the score, or
    -- nil for a member that is not there, changing nothing.
    local score = call('ZADD', k, 'XX', 'INCR', 0, id)
    if score then
      local expiry = math.max(tonumber(score), now + lease)
      call('ZADD', k, 'XX', expiry, id)
      keep(k, expiry, false)
      out[o + 1], out[o + 2], out[o + 3] = 1, call('ZCARD', k), expiry
    else
      out[o + 1], out[o + 2], out[o + 3] = 0, call('ZCARD', k), 0
    end
  end
end
return out
