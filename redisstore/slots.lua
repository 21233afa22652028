-- floodgate: concurrency limits (slots), slot.Spec.Step in Lua.
-- A key's slots are a sorted set, <prefix>{key}:c, of its permits: the
-- member is the permit's id, the score its expiry in µs. Every number
-- stays below 2^53, so Lua's doubles (and a sorted set's scores) hold it
-- exactly. A name in double braces is one of Go's constants
-- (slotLuaConstants in concurrency.go).
--
-- KEYS[i] is op i's key. ARGV[1] is now in µs when the Store has a Clock;
-- without it, the first op's kind, and now is Redis's TIME. Then each op:
-- its kind and its arguments,
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
-- argument are what a call costs Redis most, after the commands. An op
-- on an empty key sweeps nothing; the ops of a call on one key read its
-- size and sweep it once.
--
-- Each op does O(log N) work plus the permits that expired, each of which
-- was added once: at most N live members per key bound every call.
--
-- slotsCall is the whole script, a function of KEYS and ARGV: the
-- script's chunk returns its answer, and the function library registers
-- it, so that there the locals below are bound once, at its first call
-- (a library is loaded where only the redis table exists).
local ACQUIRE, RELEASE, EXTEND = {{SLOT_ACQUIRE}}, {{SLOT_RELEASE}}, {{SLOT_EXTEND}}
local call, pcall, tonumber, format, rep, type, max, ceil, expireGT

local function slotsCall(KEYS, ARGV)
  if not call then
    call, pcall, tonumber, format, rep = redis.call, redis.pcall, _G.tonumber, string.format, string.rep
    type, max, ceil = _G.type, math.max, math.ceil
    expireGT = (redis.REDIS_VERSION_NUM or 0) >= 0x070000
  end
  local now, nown, a = ARGV[1], nil, 2
  if now == ACQUIRE or now == RELEASE or now == EXTEND then
    local t = call('TIME')
    local us = t[2]
    if #us < 6 then
      us = rep('0', 6 - #us) .. us
    end
    now, a = t[1] .. us, 1
  end
  -- The ops' answers: in out when there are several, else in ans alone.
  -- (No local functions: a closure and its upvalues cost a call more than
  -- a command does.) With several, live keeps each key's live permits
  -- after its first op, false for a key of the wrong type: the ops of a
  -- call share now, so a key swept once stays swept; and kept the latest
  -- expiry a key's TTL was set for in the call.
  local out, live, kept, ans = nil, nil, nil, nil
  if #KEYS > 1 then
    out, live, kept = {}, {}, {}
  end
  for i = 1, #KEYS do
    local k, kind = KEYS[i], ARGV[a]
    local held = live and live[k]
    if held == nil then
      held = pcall('ZCARD', k)
      if type(held) == 'table' then
        held = false
      elseif held > 0 then
        -- Permits live for [acquired, expiry): drop those at or before now.
        held = held - call('ZREMRANGEBYSCORE', k, '-inf', now)
      end
    end
    if not held then
      ans = 'FLOODGATE wrong type: ' .. k .. ' is not a set of permits'
    elseif kind == RELEASE then
      local done = held > 0 and call('ZREM', k, ARGV[a + 1]) or 0
      held = held - done
      ans = held * 2 + done
    else
      nown = nown or tonumber(now)
      -- expiry and ttl: the TTL in ms k needs for a permit that expires
      -- then, when the op set one; fresh: k was empty.
      local expiry, ttl, fresh
      if kind == ACQUIRE then
        local n, id = tonumber(ARGV[a + 1]), ARGV[a + 4]
        if held < n then
          expiry = nown + tonumber(ARGV[a + 2])
          local e = format('%d', expiry)
          if call('ZADD', k, 'NX', e, id) == 0 then
            ans = 'FLOODGATE permit held already'
          else
            ttl, fresh, held = ARGV[a + 3], held == 0, held + 1
            ans = format('%s %d', e, held)
          end
        elseif call('ZADD', k, 'XX', 'INCR', 0, id) then
          -- A full key that holds the id already: an error, as Step's
          -- duplicate acquire is whether or not the key has room (ZADD XX
          -- INCR 0 is ZSCORE within floodgate's ACL).
          ans = 'FLOODGATE permit held already'
        else
          local earliest = call('ZRANGE', k, 0, 0, 'WITHSCORES')
          ans = format('-%d %d', tonumber(earliest[2]) - nown, held)
        end
      else -- EXTEND
        -- ZADD XX INCR 0 is ZSCORE within floodgate's ACL: the score, or
        -- nil for a member that is not there, changing nothing.
        local lease, id = tonumber(ARGV[a + 1]), ARGV[a + 3]
        local score = held > 0 and call('ZADD', k, 'XX', 'INCR', 0, id)
        if score then
          expiry = max(tonumber(score), nown + lease)
          local e = format('%d', expiry)
          call('ZADD', k, 'XX', e, id)
          -- ARGV's TTL is for an expiry a lease from now; a later one
          -- keeps k longer.
          ttl = format('%d', tonumber(ARGV[a + 2]) + ceil((expiry - nown) / 1000) - ceil(lease / 1000))
          ans = format('%s %d', e, held)
        else
          ans = held * 2
        end
      end
      -- Keep k live at least until expiry: its TTL only grows, since
      -- another limit on the key may have a longer lease. A fresh key has
      -- no TTL yet, which GT takes for an infinite one. Before Redis 7,
      -- which has no PEXPIRE GT, the TTL is set when expiry is the key's
      -- latest (floodgate's ACL has no PTTL).
      if not ttl or not fresh and kept and kept[k] and expiry <= kept[k] then
        -- Nothing to keep, or kept as long already.
      elseif fresh then
        call('PEXPIRE', k, ttl)
      elseif expireGT then
        call('PEXPIRE', k, ttl, 'GT')
      elseif tonumber(call('ZRANGE', k, -1, -1, 'WITHSCORES')[2]) <= expiry then
        call('PEXPIRE', k, ttl)
      end
      if ttl and kept and (fresh or expiry > (kept[k] or 0)) then
        kept[k] = expiry
      end
    end
    if out then
      out[i], live[k] = ans, held
    end
    a = a + (kind == RELEASE and 2 or kind == EXTEND and 4 or 5)
  end
  return out or ans
end
