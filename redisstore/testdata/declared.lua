-- floodgate's tests: a checker of the keys the scripts name. The tests
-- put it before prelude.lua, whose init then binds call and rpcall to
-- checkedCall and checkedPcall, and each entry (bucketOne, bucketBatch,
-- decideBatch) calls checkKeys with the call's keys first. A command
-- that names a key the call did not declare, or a command missing from
-- KEY_ARGS, fails the script, and so the test that ran it (see
-- TestDeclaredKeys).

-- KEY_ARGS says, for each command the scripts send, which of its
-- arguments are keys: 'first' the one after the command's name, 'all'
-- every one, 'none' none.
local KEY_ARGS = {
  GET = 'first', SET = 'first', SETRANGE = 'first', PEXPIRE = 'first',
  ZADD = 'first', ZREM = 'first', ZRANGE = 'first', ZCARD = 'first', ZCOUNT = 'first',
  ZREMRANGEBYRANK = 'first', ZREMRANGEBYSCORE = 'first',
  MGET = 'all', EXISTS = 'all', DEL = 'all',
  TIME = 'none',
}

-- declaredKeys is the keys of the call being run, as a set.
local declaredKeys = {}

local function checkKeys(keys)
  declaredKeys = {}
  for i = 1, #keys do declaredKeys[keys[i]] = true end
end

local function checkKey(cmd, key)
  if not declaredKeys[key] then
    error('floodgate key check: ' .. cmd .. ' names the key ' .. tostring(key) .. ', which the call did not declare')
  end
end

local function checkArgs(cmd, ...)
  local how = KEY_ARGS[string.upper(cmd)]
  if not how then
    error('floodgate key check: the command ' .. tostring(cmd) .. ' is not in KEY_ARGS')
  end
  if how == 'first' then
    checkKey(cmd, (select(1, ...)))
  elseif how == 'all' then
    for i = 1, select('#', ...) do checkKey(cmd, (select(i, ...))) end
  end
end

local function checkedCall(cmd, ...)
  checkArgs(cmd, ...)
  return redis.call(cmd, ...)
end

local function checkedPcall(cmd, ...)
  checkArgs(cmd, ...)
  return redis.pcall(cmd, ...)
end
