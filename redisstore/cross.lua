-- floodgate: the fast path's batch across the slots of one Redis Cluster
-- master (see cross.go). It runs only as the library's function _cross,
-- registered with the flag allow-cross-slot-keys, and declares no keys:
-- Redis refuses declared keys of several slots (CROSSSLOT) before a
-- script runs, so the keys come as arguments, as the _argkeys functions
-- take theirs (argKeys in prelude.lua): the one exception to declared
-- keys. As everywhere, every key a command names is one the client
-- passed, none built here; and each command names keys of one slot only.
--
-- The first argument holds the parts' sizes, struct '>I4I4' each (the
-- part's keys and its arguments); the others hold the parts, one per
-- slot: a probe key of the slot that floodgate never writes, the keys (each request's state key, then each request's
-- override key, as bucketBatch takes them, or each distinct key once when
-- the last argument is a key map: see expandKeys), then the arguments
-- (each run of equal ones once when the last is an argument map: see
-- expandArgs).
-- Either way the lone requests come first, on the first keys.
--
-- Before it decides a slot's requests, it reads the probe key, under
-- pcall, in the same command as the first read of the lone requests'
-- keys: an MGET of the probe and the keys, or, when the slots read lately
-- mostly found their keys new, an EXISTS of the probe, the keys and their
-- override keys
-- (which, when it counts none, spares the MGET and says what markAbsent
-- would). Redis answers that command only when this node serves the slot
-- and will serve every key of it for the rest of the call: the node owns
-- the slot and is not migrating it (a missing key of a migrating slot, as
-- the probe always is, is an ASK redirection, which Redis 7.0 turns into
-- "Script attempted to access a non local key in a cluster node"; a slot
-- it does not own, or imports without ASKING, the same). Otherwise the
-- slot is refused whole, before anything of it is read or written, and
-- the client sends its requests again to the slot's owner (cross.go). A
-- script runs alone, so what the probe found holds until the call ends.
--
-- The reply is one record per part: CROSS_REFUSED alone, or
-- CROSS_DECIDED, the length of bucketBatch's reply (struct '>I4') and
-- that reply.

-- Its locals live in a function of their own, which returns crossBatch,
-- so that they add one to the library chunk's: a Lua function (the chunk
-- is one) holds at most 200 locals at once.
local crossBatch = (function()
  local CROSS_DECIDED, CROSS_REFUSED = {{CROSS_DECIDED}}, {{CROSS_REFUSED}}

  local crossKeys, crossArgs = {}, {} -- one part's, filled from the start
  local crossNK, crossNA = 0, 0       -- how far the last part filled them
  local crossOut = {}
  -- crossProbeKeys holds the keys of one EXISTS, filled from the start.
  local crossProbeKeys = {}
  -- crossNew says how often the slots read lately found none of their
  -- keys, from 0 to CROSS_NEW_MAX, one up for each such slot and one
  -- down for each other: over half, the next slot starts with EXISTS
  -- rather than MGET (see crossPart), which costs one command where its
  -- keys are new, and two where they are not. It outlives the call, as
  -- the library's state does.
  local crossNew, CROSS_NEW_MAX = 0, 8

  -- crossSaw counts a slot read in crossNew: new, whether it found none
  -- of its keys.
  local function crossSaw(new)
    if new then
      if crossNew < CROSS_NEW_MAX then crossNew = crossNew + 1 end
    elseif crossNew > 0 then
      crossNew = crossNew - 1
    end
  end

  -- crossPart decides the part of argv whose probe is argv[i] (its nk
  -- keys and nargs arguments follow) as bucketBatch decides a batch, and returns
  -- bucketBatch's reply, or false when the node does not serve the slot.
  local function crossPart(argv, i, nk, nargs, probe, check)
    for j = 1, nk do crossKeys[j] = argv[i + j] end
    for j = nk + 1, crossNK do crossKeys[j] = nil end
    crossNK = nk
    local a0 = i + nk
    for j = 1, nargs do crossArgs[j] = argv[a0 + j] end
    for j = nargs + 1, crossNA do crossArgs[j] = nil end
    crossNA = nargs
    local n = floor(nk / 2) -- crossKeys[n + j] is crossKeys[j]'s override key
    -- An argument map expanded, as bucketBatch would, before the lone
    -- requests are counted.
    local args
    args, nargs = expandArgs(crossArgs, nargs, nargs > 0 and byte(crossArgs[nargs]))
    if check then
      crossKeys[nk + 1] = probe
      check(crossKeys)
      crossKeys[nk + 1] = nil
    end
    -- The lone requests, on keys of their own, come first (as in
    -- bucketBatch): their states are read with the probe.
    local lone = 0
    while lone < nargs do
      local size = #args[lone + 1]
      if size ~= BUCKET_ARG and size ~= WINDOW_ARG then break end
      lone = lone + 1
    end
    local read, served
    if 2 * crossNew > CROSS_NEW_MAX and lone > 0 and 2 * lone < UNPACK_MAX then
      -- The last slots' keys were mostly new: probably these are too (a
      -- limit whose keys expire between requests). One EXISTS of the
      -- probe, the keys and their override keys both checks the slot
      -- and, when it counts none, says what markAbsent would.
      crossProbeKeys[1] = probe
      for j = 1, lone do
        local key = crossKeys[j]
        crossProbeKeys[2 * j], crossProbeKeys[2 * j + 1] = key, crossKeys[n + j]
      end
      local r = rpcall('EXISTS', unpack(crossProbeKeys, 1, 2 * lone + 1))
      served = type(r) == 'number'
      if r == 0 then
        read = {}
        for j = 1, lone do read[j] = true end
      elseif served then
        read = call('MGET', unpack(crossKeys, 1, lone))
      end
      if served then crossSaw(r == 0) end
    elseif lone < UNPACK_MAX then
      read = rpcall('MGET', probe, unpack(crossKeys, 1, lone))
      served = not read.err
      if served then
        table.remove(read, 1) -- the probe's
        local new = lone > 0
        for j = 1, lone do
          if read[j] then new = false; break end
        end
        crossSaw(new)
      end
    else
      -- Never with floodgate's batches, but bounded all the same:
      -- bucketBatch then reads the lone states itself.
      local r = rpcall('EXISTS', probe)
      served, read = type(r) ~= 'table', nil
    end
    return served and bucketBatch(crossKeys, args, read)
  end

  -- crossLoneKeys holds a lone part's keys and probe for check.
  local crossLoneKeys = {}

  -- crossLone decides a part that is one lone request, the commonest part
  -- (10,000 keys rarely share a slot): its state key key, override key
  -- okey, and argument arg, of length size (BUCKET_ARG or WINDOW_ARG),
  -- probe the slot's probe key. It returns bucketBatch's reply for it, or
  -- false when the node does not serve the slot. It is bucketBatch's read
  -- and dispatch for the one request, without the batch's work around
  -- them, which a call of many parts would pay once a part; and where the
  -- EXISTS that checks the slot counted something, the value MGET then
  -- finds missing is left to readBucket, rather than counted again.
  local function crossLone(key, okey, arg, size, probe, check)
    if check then
      crossLoneKeys[1], crossLoneKeys[2], crossLoneKeys[3] = key, okey, probe
      check(crossLoneKeys)
    end
    local raw
    if 2 * crossNew > CROSS_NEW_MAX then
      local r = rpcall('EXISTS', probe, key, okey)
      if type(r) ~= 'number' then return false end
      if r == 0 then
        raw = true -- new, without an override (see markAbsent)
      else
        -- false: another type, or an override alone; readBucket reads it.
        raw = call('MGET', key)[1]
      end
      crossSaw(r == 0)
    else
      local r = rpcall('MGET', key, probe)
      if r.err then return false end
      raw = r[1]
      if not raw then
        raw = call('EXISTS', key, okey) == 0 -- markAbsent's answer
      end
      crossSaw(not r[1])
    end
    local r, err
    if size == BUCKET_ARG then
      r, err = decideBucketLone(key, okey, arg, callTime, raw)
    else
      r, err = decideWindowLone(key, okey, arg, callTime, raw)
    end
    return r or errRecord(err)
  end

  -- crossBatch decides the parts of argv; check, when given (the tests' key
  -- checker, see scriptSet), is called with each part's keys and its probe
  -- before any command of the part.
  return function(argv, check)
    callNow = false -- the call's time, read once for all its parts (callTime)
    local sizes, at = argv[1], 1 -- the next part's sizes at sizes[at]
    local i, na, m = 2, #argv, 0
    while i <= na do
      local nk, nargs
      nk, nargs, at = sunpack('>I4I4', sizes, at)
      local probe = argv[i] -- the part's keys follow, then its arguments
      local r -- the part's reply (bucketBatch's), or false: refused
      local size = nk == 2 and nargs == 1 and #argv[i + 3]
      if size == BUCKET_ARG or size == WINDOW_ARG then
        r = crossLone(argv[i + 1], argv[i + 2], argv[i + 3], size, probe, check)
        i = i + 4
      else
        r = crossPart(argv, i, nk, nargs, probe, check)
        i = i + 1 + nk + nargs
      end
      -- The record's head and the reply apart: concat joins them with the
      -- rest, rather than each part making a string of the two.
      if r then
        crossOut[m + 1], crossOut[m + 2] = spack('>BI4', CROSS_DECIDED, #r), r
        m = m + 2
      else
        crossOut[m + 1] = spack('>B', CROSS_REFUSED)
        m = m + 1
      end
    end
    return concat(crossOut, '', 1, m)
  end
end)()
