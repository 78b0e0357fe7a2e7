-- Claim replies (claim.lua, unpark.lua): {more, n, then n times: key, and the record's head,
-- flow and url}.

local function emit(out, key, tkey, h)
  out[#out + 1] = key
  out[#out + 1] = prefix_of(tkey, h)
  out[2] = out[2] + 1
end

-- Lease a task to the call's token until max(due, now) + its timeout + margin: its head now,
-- its lease and its place in the call's record list in `claims` (written by write_claims),
-- and the task in the reply. h and raw are from head_ahead(tkey): the reply's flow and url
-- come from raw when they are in it.
local function take(key, tkey, h, raw, now, margin, claim, claims, out)
  local leases = claims.leases
  leases[#leases + 1] = math.max(h[DUE], now) + h[TIMEOUT] + margin
  leases[#leases + 1] = key
  claims.keys[#claims.keys + 1] = key
  h[ST], h[CLAIM], h[STARTED] = 'd', claim, 0
  local packed = pack_head(h)
  redis.call('SETRANGE', tkey, 0, packed)
  out[#out + 1] = key
  out[#out + 1] = packed .. part_of(tkey, raw, HEAD, h[FL] + h[UL])
  out[2] = out[2] + 1
end

local function new_claims() return {keys = {}, leases = {}} end

-- The leases of a call's claims into `ls`, and their keys into the call's record list (so
-- that a re-sent call returns the same tasks): one ZADD and one RPUSH for the call rather
-- than one of each per task (a Redis call each), in pieces that Lua's stack takes.
local function write_claims(P, record, claims)
  local keys, leases = claims.keys, claims.leases
  if #keys == 0 then return end
  leases[#leases + 1] = INDEX_KEEPER_SCORE  -- the keeper rides along (lua/lib/record.lua)
  leases[#leases + 1] = INDEX_KEEPER
  for i = 1, #leases, 1000 do
    redis.call('ZADD', P .. 'ls', unpack(leases, i, math.min(i + 999, #leases)))
  end
  for i = 1, #keys, 1000 do
    redis.call('RPUSH', record, unpack(keys, i, math.min(i + 999, #keys)))
  end
  redis.call('PEXPIRE', record, 300000)
end

-- A call re-sent after its reply was lost: hand back what it took and still holds.
local function replay_claim(P, record, claim, out)
  for _, key in ipairs(redis.call('LRANGE', record, 0, -1)) do
    local tkey = P .. 't:' .. key
    local h = head(tkey)
    if h and h[ST] == 'd' and h[CLAIM] == claim then emit(out, key, tkey, h) end
  end
end
