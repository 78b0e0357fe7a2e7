-- sched_reserve: reserve due occurrences of schedules, compare-and-set on what the caller read.
-- The reserved occurrences are recorded as outstanding; the caller then creates their tasks.
--
-- KEYS[1]  bucket prefix "{<prefix>:<bucket>}:" (keys as in sched_put.lua)
-- ARGV[1]  now_ms
-- ARGV[2]  lease_ms: an outstanding occurrence whose task is not confirmed by now + lease is
--          looked at again by any process (its creator may have died)
-- ARGV[3..] groups: id, ver, expected next (as read), new next ("" for none), k, occ_1..occ_k
--          (ascending ms; occ_k becomes "hi")
--
-- Reply: one SchedReserveReply per group (timewheel/store/replies.py)
--    1 RESERVED  reserved (or reserved by this very call, re-sent after a lost reply)
--    0 STALE     missing, deleted, paused, or its version or next changed since the caller
--                read it; nothing written for that group
local P = KEYS[1]
local now, lease = tonumber(ARGV[1]), tonumber(ARGV[2])
local out = {}
local i = 3
while i <= #ARGV do
  local id, ver, expected, nxt = ARGV[i], ARGV[i + 1], ARGV[i + 2], ARGV[i + 3]
  local k = tonumber(ARGV[i + 4])
  local first = i + 5
  i = first + k
  local rkey = P .. 's:' .. id
  local st = redis.call('HMGET', rkey, 'state', 'paused', 'ver', 'next')
  if st[3] == ver and st[1] ~= 'deleted' and st[2] == '0' and st[4] == expected and k > 0 then
    -- This group's checks are done; its writes follow.
    if nxt == '' then
      redis.call('HDEL', rkey, 'next')
      redis.call('ZREM', P .. 'sdue', id)
    else
      redis.call('HSET', rkey, 'next', nxt)
      redis.call('ZADD', P .. 'sdue', nxt, id)
    end
    redis.call('HSET', rkey, 'hi', ARGV[first + k - 1])
    for j = first, first + k - 1 do
      local member = id .. ' ' .. ARGV[j]
      redis.call('ZADD', P .. 'socc', now + lease, member)
      redis.call('ZADD', P .. 'soccl', 0, member)
    end
    out[#out + 1] = 1
  elseif k > 0 and st[3] == ver and (st[4] or '') == nxt
      and redis.call('ZSCORE', P .. 'soccl', id .. ' ' .. ARGV[first + k - 1]) then
    out[#out + 1] = 1  -- a re-sent call: this group's reservation is already in place
  else
    out[#out + 1] = 0
  end
end
return out
