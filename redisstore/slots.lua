-- floodgate: concurrency limits (slots), core.SlotSpec.Step in Lua.
-- A key's slots are a sorted set, <prefix>{key}:c, of its permits: the
-- member is the permit's id, the score its expiry in µs. Every number
-- stays below 2^53, so Lua's doubles (and a sorted set's scores) hold it
-- exactly. A name in double braces is one of Go's constants
-- (slotLuaConstants in concurrency.go).
--
-- KEYS[i] is op i's key. ARGV[1] is now in µs, or -1 for Redis's TIME.
-- Then each op: its kind and its arguments,
--   acquire: N, the lease in µs, the key's TTL in ms for an expiry a lease
--            from now, the permit id;
--   release: the permit id;
--   extend:  the lease, the TTL as for acquire, the permit id.
-- The reply is op 1's answer for one op, else a list of the ops' answers:
--   an integer 2*held + done for a release, or an extend of a permit not
--   held (done 0 or 1, held the permits live after it);
--   "E H" for a done acquire or extend: the permit's expiry and held;
--   "-R H" for a denied acquire: the µs until the earliest expiry, held;
--   "FLOODGATE ..." for a key that is not a sorted set, or a duplicate
--   acquire.
-- The answers are scalars, and now stays a string unless an op adds to
-- it, since a reply table and a number's conversion to a command's
-- argument are what a call costs Redis most, after the commands.
--
-- Each op does O(log N) work plus the permits that expired, each of which
-- was added once: at most N live members per key bound every call.
local ACQUIRE, RELEASE, EXTEND = {{SLOT_ACQUIRE}}, {{SLOT_RELEASE}}, {{SLOT_EXTEND}}
local call, tonumber, format = redis.call, tonumber, string.format
-- Redis 7 takes PEXPIRE's GT, which makes keep one command.
local GT = (redis.REDIS_VERSION_NUM or 0) >= 0x070000

local now, nown = ARGV[1], nil
if now == '-1' then
  local t = call('TIME')
  local us = t[2]
  if #us < 6 then
    us = string.rep('0', 6 - #us) .. us
  end
  now = t[1] .. us
end

-- keep makes k live at least until expiry, ttl ms from now: its TTL only
-- grows, since another limit on the key may have a longer lease. A fresh
-- key has no TTL yet, which GT takes for an infinite one. Before Redis 7
-- the TTL is set when expiry is the key's latest (floodgate's ACL has no
-- PTTL).
local function keep(k, expiry, ttl, fresh)
  if fresh then
    call('PEXPIRE', k, ttl)
  elseif GT then
    call('PEXPIRE', k, ttl, 'GT')
  elseif tonumber(call('ZRANGE', k, -1, -1, 'WITHSCORES')[2]) <= expiry then
    call('PEXPIRE', k, ttl)
  end
end

-- step applies the op whose kind is ARGV[a] to k, and returns its answer
-- and the index of the next op's kind.
local function step(k, a)
  local kind = ARGV[a]
  -- Permits live for [acquired, expiry): drop those at or before now.
  local r = redis.pcall('ZREMRANGEBYSCORE', k, '-inf', now)
  local wrong = type(r) == 'table' and r.err
  if kind == RELEASE then
    if wrong then
      return 'FLOODGATE wrong type: ' .. k .. ' is not a set of permits', a + 2
    end
    local done = call('ZREM', k, ARGV[a + 1])
    return call('ZCARD', k) * 2 + done, a + 2
  end
  if wrong then
    return 'FLOODGATE wrong type: ' .. k .. ' is not a set of permits', a + (kind == EXTEND and 4 or 5)
  end
  nown = nown or tonumber(now)
  if kind == ACQUIRE then
    local n, lease, ttl, id = tonumber(ARGV[a + 1]), ARGV[a + 2], ARGV[a + 3], ARGV[a + 4]
    local held = call('ZCARD', k)
    if held < n then
      local expiry = nown + tonumber(lease)
      local e = format('%d', expiry)
      if call('ZADD', k, 'NX', e, id) == 0 then
        return 'FLOODGATE permit held already', a + 5
      end
      keep(k, expiry, ttl, held == 0)
      return format('%s %d', e, held + 1), a + 5
    elseif call('ZADD', k, 'XX', 'INCR', 0, id) then
      -- A full key that holds the id already: an error, as Step's
      -- duplicate acquire is whether or not the key has room (ZADD XX
      -- INCR 0 is ZSCORE within floodgate's ACL).
      return 'FLOODGATE permit held already', a + 5
    end
    local first = call('ZRANGE', k, 0, 0, 'WITHSCORES')
    return format('-%d %d', tonumber(first[2]) - nown, held), a + 5
  end
  -- EXTEND. ZADD XX INCR 0 is ZSCORE within floodgate's ACL: the score,
  -- or nil for a member that is not there, changing nothing.
  local lease, ttl, id = tonumber(ARGV[a + 1]), tonumber(ARGV[a + 2]), ARGV[a + 3]
  local score = call('ZADD', k, 'XX', 'INCR', 0, id)
  if not score then
    return call('ZCARD', k) * 2, a + 4
  end
  local expiry = math.max(tonumber(score), nown + lease)
  local e = format('%d', expiry)
  call('ZADD', k, 'XX', e, id)
  -- ttl is for an expiry a lease from now; a later one keeps k longer.
  ttl = ttl + math.ceil((expiry - nown) / 1000) - math.ceil(lease / 1000)
  keep(k, expiry, format('%d', ttl), false)
  return format('%s %d', e, call('ZCARD', k)), a + 4
end

if #KEYS == 1 then
  return (step(KEYS[1], 2))
end
local out, a = {}, 2
for i = 1, #KEYS do
  out[i], a = step(KEYS[i], a)
end
return out
