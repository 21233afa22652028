-- floodgate: what decide.lua and bucket.lua share. The Go code prepends
-- this file to each of them, so each script is one chunk for EVALSHA.
-- Every number stays below 2^53, so Lua's doubles hold it exactly.

local TWO53 = 9007199254740992
-- Globals read once: a global is a table lookup at every use.
local floor, max, min, format, match, tonumber = math.floor, math.max, math.min, string.format, string.match, tonumber
local call, rpcall = redis.call, redis.pcall

-- floor(a*b/c) and remainder, exactly, for 0 <= a, b and 0 < c < 2^52.
local function muldiv(a, b, c)
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

local function fmt(x) return format('%d', x) end
local function fmt3(a, b, c) return format('%d:%d:%d', a, b, c) end

local function corrupt(key)
  return redis.error_reply('FLOODGATE corrupt state: key ' .. key .. ' does not hold floodgate data')
end

local function wrongtype(key)
  return redis.error_reply('FLOODGATE wrong type: key ' .. key .. ' holds a value that is not floodgate state')
end
