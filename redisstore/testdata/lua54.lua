-- floodgate's tests: the scripts' pure functions on vectors of this
-- file's own, one line per result. TestLua54 puts it at the end of the
-- chunk of prelude.lua, bucket.lua and decide.lua, runs the chunk on
-- Redis (Lua 5.1) and on Lua 5.4, and wants the same lines from both
-- (and mulDiv's as Go's arith.MulDiv has them).

local lines = {}

-- show writes a value alike on both: a whole number in decimal (5.4
-- would write a float 3 as 3.0), a string in hex, anything else as
-- tostring does.
local function show(v)
  if type(v) == 'number' then
    if v % 1 == 0 then return format('%d', v) end
    return format('%.17g', v)
  end
  if type(v) == 'string' then
    return (string.gsub(v, '.', function(c) return format('%02x', byte(c)) end))
  end
  return tostring(v)
end

local function emit(name, ...)
  local parts = {name}
  for i = 1, select('#', ...) do parts[#parts + 1] = show((select(i, ...))) end
  lines[#lines + 1] = concat(parts, ' ')
end

-- rand returns a number in [0, n), n at most 2^52, from a generator
-- (MINSTD) whose products stay below 2^53: the same numbers on both.
local seed = 20261128
local function rand31()
  seed = (seed * 48271) % 2147483647
  return seed
end
local function rand(n)
  if n <= 2147483647 then return rand31() % n end
  return ((rand31() % 67108864) * 67108864 + rand31() % 67108864) % n
end

-- mulDiv, its fast branch and the long one (a product past 2^53, and past
-- 2^63, where 5.4's integers would wrap), for results below 2^53.
for _, v in ipairs({{0, 5, 3}, {1, 1000000, 3}, {7, 9, 7}, {4503599627370495, 2, 3}, {35184372088831, 2147483647, 16777217}}) do
  emit('mulDiv', v[1], v[2], v[3], mulDiv(v[1], v[2], v[3]))
end
for _ = 1, 300 do
  local a, b = rand(35184372088832), rand(2147483648)
  local c = 16777216 + rand(1099511627776)
  emit('mulDiv', a, b, c, mulDiv(a, b, c))
end

-- The limits a step runs on: a bucket's quota, rate, period, tau, and
-- n*T.
local function bucketLimit()
  local L, R = 1 + rand(1000), 1 + rand(1000)
  local P = 1000 + rand(3600000000)
  local tauQ, tauR = mulDiv(L, P, R)
  return L, R, P, tauQ, tauR
end

for _ = 1, 300 do
  local L, R, P, tauQ, tauR = bucketLimit()
  local now = 1700000000000000 + rand(1000000000)
  local n = rand(L + 3)
  local iq, ir = mulDiv(n, P, R)
  local tat, f, sr = now - 500000000 + rand(1000000000), rand(R), R
  if rand(4) == 0 then sr = 1 + rand(1000) end
  local mode = rand(3)
  emit('stepBucket', tat, f, sr, now, n, L, R, P, mode,
    stepBucket(tat, f, sr, now, n, L, R, P, tauQ, tauR, iq, ir, mode))
  local last, skew = tat - rand(P), rand(2) * rand(1000000)
  emit('decideBucket', last, skew,
    decideBucket(tat, f, sr, last, skew, now, n, L, R, P, tauQ, tauR, iq, ir, mode))
  emit('timeline', timeline(now, last, skew))
end

for _ = 1, 300 do
  local L, P = 1 + rand(1000), 1000 + rand(3600000000)
  local now = 1700000000000000 + rand(1000000000)
  local s, se = windowOf(P, 0, 0, 0, now - rand(2 * P))
  local found, count = rand(3) ~= 0, rand(L + 2)
  local last, skew = now - rand(P), rand(2) * rand(1000000)
  local c0, c1, c2 = 0, 0, 0
  if rand(4) == 0 then c0, c1, c2 = now - rand(P), now + 1 + rand(P), now + P + 1 + rand(P) end
  local n, mode = rand(L + 3), rand(3)
  emit('decideFixed', found, s, se, count, last, skew, now, n, L, P, c0, c1, c2, mode,
    decideFixed(found, s, se, count, last, skew, now, n, L, P, c0, c1, c2, mode))
  local W = P
  local cur = now - now % W
  local prev, curr = 1 + rand(L), 1 + rand(L)
  local m = 1 + rand(L)
  emit('slidingAllowAt', cur, W, L, prev, curr, m, slidingAllowAt(cur, W, L, prev, curr, m))
end

-- The states' forms, written and read back.
for _ = 1, 100 do
  local tat, R = 1700000000000000 + rand(1000000000), 1 + rand(1000)
  local f, skew, e = rand(2) * rand(R), rand(2) * rand(1000000), rand(2) * (tat + rand(1000000))
  local last = tat - rand(1000000)
  local raw = fmtBucket(tat, f, R, last, skew, e, rand(2) == 0)
  emit('bucketState', raw, parseBucket(raw))
  local s = 1700000000000000 + rand(1000000000)
  raw = fmtFixed(s, s + 1 + rand(1000000000), rand(1000), s + rand(1000), rand(1000000), rand(2) == 0)
  emit('fixedState', raw, parseFixed(raw))
end
emit('oldStates', parseBucket('123:4'), parseBucket('5:1:7'), parseFixed('-10:20:3:4:5'), parseFixed('x'))

-- An override, its limits and their keys beside its key.
for _, raw in ipairs({'fg1;1,10,5,1000000,0', 'fg1@1700000000000000;1,10,5,1000000,0;4,3,3,60000000,2\n["a","b"]',
  'fg1;2,100,100,3600000000,0;3,7,7,1000,0', 'fg1;9,1,1,1,0', 'nope'}) do
  local ov = parseOverride(raw, 'p:{k}:o')
  if not ov then
    emit('override', raw, 'nil')
  else
    emit('override', raw, ov.expires, #ov.specs, concat(ov.keys, ','))
    for i, sp in ipairs(ov.specs) do
      emit('overrideSpec', i, sp.kind, sp.quota, sp.rate, sp.period, sp.tauQ, sp.tauR, sp.tq, sp.tr)
    end
  end
end

-- A batch's arguments and keys as bucketBatch reads them from an
-- argument map and from a key map (expandArgs, expandKeys): the map's
-- counts are numbers that 5.4 must index with alike.
local function showAll(t, n)
  local parts = {}
  for i = 1, n do parts[i] = t[i] end
  return concat(parts, ',')
end
local args, na = expandArgs({'A', 'g2', 'B', 'a\0\3\0\1\1\44'}, 4, 97)
emit('expandArgs', na, showAll(args, na))
args, na = expandArgs({'A', 'B'}, 2, 66)
emit('expandArgs', na, showAll(args, na))
local keys, nk = expandKeys({'k1', 'k2', 'o1', 'o2'}, 'k\0\5\0\2\0\2\0\1\0\3')
emit('expandKeys', nk, showAll(keys, 2 * nk))

-- decide.lua's reply holds integers, where 5.4 tells them from floats.
local out = {1, 2.0 + 0.0, 'x', 1700000000000000 / 2}
if toint then integers(out) end -- as decideBatch
for _, v in ipairs(out) do
  emit('integer', v, type(v) ~= 'number' or not math.type or math.type(v) == 'integer')
end
emit('fmt', fmt(3), fmt(-1 + 0.0), fmt5(1, 2.0 + 0.0, 3, 4, 9007199254740991))
emit('unpack', select('#', unpack({1, 2, 3}, 1, 3)))

return concat(lines, '\n')
