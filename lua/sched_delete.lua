-- sched_delete: delete a schedule and hand back its outstanding occurrences.
-- The record stays for keep_ms marked deleted (invisible to the API): its "hi" keeps a
-- re-created schedule of the same id from reusing occurrence keys, and its "op" lets a
-- re-sent call answer as the first did.
--
-- KEYS[1]  bucket prefix "{<prefix>:<bucket>}:" (keys as in sched_put.lua)
-- ARGV[1]  schedule id
-- ARGV[2]  request id, unique per API call
-- ARGV[3]  keep_ms, how long the deleted record is kept
--
-- Reply: {code, occ...}; code is a SchedDeleteReply (timewheel/store/replies.py)
--    1 DELETED     deleted (or this very call was re-sent)
--   -1 NOT_FOUND   no such schedule
--   occ   outstanding occurrences (ms): cancel each, then drop them (as for sched_pause)
local P, id = KEYS[1], ARGV[1]
local rkey = P .. 's:' .. id
local st = redis.call('HMGET', rkey, 'ver', 'state', 'op')
if not st[1] then return {-1} end
if st[2] == 'deleted' and st[3] ~= ARGV[2] then return {-1} end

local out = {1}
local members = redis.call('ZRANGEBYLEX', P .. 'soccl', '[' .. id .. ' ', '(' .. id .. '!')
for _, m in ipairs(members) do out[#out + 1] = tonumber(string.sub(m, #id + 2)) end
if st[2] == 'deleted' then return out end

-- All checks are done; writes follow.
redis.call('HSET', rkey, 'state', 'deleted', 'op', ARGV[2], 'paused', '1',
  'ver', tonumber(st[1]) + 1)
redis.call('HDEL', rkey, 'next')
redis.call('ZREM', P .. 'sdue', id)
redis.call('ZREM', P .. 'sids', id)
redis.call('PEXPIRE', rkey, ARGV[3])
return out
