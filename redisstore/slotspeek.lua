-- floodgate: a look at one key's slots that changes nothing, for the
-- explain API. KEYS[1] is the key's sorted set of permits (slots.lua);
-- ARGV[1] is now in µs, or -1 for Redis's TIME. The reply is now, the
-- permits live at now (expiry after now), and the earliest expiry among
-- them, 0 for none. Expired permits are counted, not dropped: the next
-- operation on the key drops them. Scores are whole µs, so the first
-- live permit is the one ranked after the expired ones; three commands
-- of O(log N) each.
local call, tonumber = redis.call, tonumber
local now = tonumber(ARGV[1])
if now < 0 then
  local t = call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
end
local k = KEYS[1]
local n = redis.pcall('ZCARD', k)
if type(n) == 'table' and n.err then
  return redis.error_reply('FLOODGATE wrong type: ' .. k .. ' is not a set of permits')
end
local expired = call('ZCOUNT', k, '-inf', now)
local earliest = 0
if n > expired then
  earliest = tonumber(call('ZRANGE', k, expired, expired, 'WITHSCORES')[2])
end
return {now, n - expired, earliest}
