-- floodgate: the fast path's batch across the slots of one Redis Cluster
-- master (see cross.go). It runs only as the library's function _cross,
-- registered with the flag allow-cross-slot-keys, and declares no keys:
-- Redis refuses declared keys of several slots (CROSSSLOT) before a
-- script runs, so the keys come as arguments, as the _argkeys functions
-- take theirs (argKeys in prelude.lua): the one exception to declared
-- keys. As everywhere, every key a command names is one the client
-- passed, none built here; and each command names keys of one slot only.
--
-- The arguments hold one part per slot: a header (struct '>I4I4': the
-- part's keys and its arguments), a probe key of the slot that floodgate
-- never writes, the keys (each request's state key, then each request's
-- override key, as bucketBatch takes them, or each distinct key once when
-- the last argument is a key map: see expandKeys), then the arguments
-- (each run of equal ones once when the last is an argument map: see
-- expandArgs).
-- Either way the lone requests come first, on the first keys.
--
-- Before it decides a slot's requests, it reads the probe key, under
-- pcall, in the same command as the first read of the lone requests'
-- keys: an MGET of the probe and the keys, or, when the last slot's keys
-- were all new, an EXISTS of the probe, the keys and their override keys
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

local CROSS_DECIDED, CROSS_REFUSED = {{CROSS_DECIDED}}, {{CROSS_REFUSED}}

local crossKeys, crossArgs = {}, {} -- one part's, filled from the start
local crossNK, crossNA = 0, 0       -- how far the last part filled them
local crossOut = {}
-- crossProbeKeys holds the keys of one EXISTS, filled from the start.
local crossProbeKeys = {}
-- crossFresh says that the last slot read found none of its keys: the
-- next starts with EXISTS rather than MGET (see crossBatch). It outlives
-- the call, as the library's state does.
local crossFresh = false

-- crossBatch decides the parts of argv; check, when given (the tests' key
-- checker, see scriptSet), is called with each part's keys and its probe
-- before any command of the part.
local function crossBatch(argv, check)
  callNow = false -- the call's time, read once for all its parts (callTime)
  local i, na, m = 1, #argv, 0
  while i <= na do
    local nk, nargs = sunpack('>I4I4', argv[i])
    local probe = argv[i + 1]
    for j = 1, nk do crossKeys[j] = argv[i + 1 + j] end
    for j = nk + 1, crossNK do crossKeys[j] = nil end
    crossNK = nk
    local a0 = i + 1 + nk
    for j = 1, nargs do crossArgs[j] = argv[a0 + j] end
    for j = nargs + 1, crossNA do crossArgs[j] = nil end
    crossNA = nargs
    i = a0 + nargs + 1
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
    if crossFresh and lone > 0 and 2 * lone < UNPACK_MAX then
      -- The last slot's keys were all new: probably these are too (a
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
        read, crossFresh = call('MGET', unpack(crossKeys, 1, lone)), false
      end
    elseif lone < UNPACK_MAX then
      read = rpcall('MGET', probe, unpack(crossKeys, 1, lone))
      served = not read.err
      if served then
        table.remove(read, 1) -- the probe's
        crossFresh = lone > 0
        for j = 1, lone do
          if read[j] then crossFresh = false; break end
        end
      end
    else
      -- Never with floodgate's batches, but bounded all the same:
      -- bucketBatch then reads the lone states itself.
      local r = rpcall('EXISTS', probe)
      served, read = type(r) ~= 'table', nil
    end
    m = m + 1
    if served then
      local r = bucketBatch(crossKeys, args, read)
      crossOut[m] = spack('>BI4', CROSS_DECIDED, #r) .. r
    else
      crossOut[m] = spack('>B', CROSS_REFUSED)
    end
  end
  return concat(crossOut, '', 1, m)
end
