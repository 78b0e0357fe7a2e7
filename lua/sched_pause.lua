-- sched_pause: stop materializing a schedule and hand back its outstanding occurrences.
--
-- KEYS[1]  bucket prefix "{<prefix>:<bucket>}:" (keys as in sched_put.lua)
-- ARGV[1]  schedule id
--
-- Reply: {code, occ...}; code is a SchedPauseReply (timewheel/store/replies.py)
--    1 PAUSED          paused now
--    0 ALREADY_PAUSED
--   -1 NOT_FOUND       no such schedule
--   occ   outstanding occurrences (ms): the caller cancels each (Store.cancel, or a tombstone
--         when the task does not exist yet), then drops them (sched_drop). Returned again by a
--         repeated pause until dropped, so a caller that died half-way is finished by the next.
local P, id = KEYS[1], ARGV[1]
local rkey = P .. 's:' .. id
local st = redis.call('HMGET', rkey, 'ver', 'state', 'paused')
if not st[1] or st[2] == 'deleted' then return {-1} end

local out = {0}
local members = redis.call('ZRANGEBYLEX', P .. 'soccl', '[' .. id .. ' ', '(' .. id .. '!')
for _, m in ipairs(members) do out[#out + 1] = tonumber(string.sub(m, #id + 2)) end
if st[3] == '1' then return out end

-- All checks are done; writes follow. A new version fails every reservation read before.
out[1] = 1
redis.call('HSET', rkey, 'paused', '1', 'ver', tonumber(st[1]) + 1)
redis.call('HDEL', rkey, 'next')
redis.call('ZREM', P .. 'sdue', id)
return out
