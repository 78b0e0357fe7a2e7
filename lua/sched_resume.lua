-- sched_resume: materialize a paused schedule again, from its next occurrence after now.
--
-- KEYS[1]  bucket prefix "{<prefix>:<bucket>}:" (keys as in sched_put.lua)
-- ARGV[1]  schedule id
-- ARGV[2]  expected version (as the caller read it, with the hi it computed next from)
-- ARGV[3]  next occurrence ms after max(now, hi); "" for none
--
-- Reply: SchedResumeReply (timewheel/store/replies.py)
--    1 RESUMED
--    0 NOT_PAUSED  nothing written
--   -1 NOT_FOUND   no such schedule
--   -3 STALE       version changed; read again and retry
local P, id = KEYS[1], ARGV[1]
local rkey = P .. 's:' .. id
local st = redis.call('HMGET', rkey, 'ver', 'state', 'paused')
if not st[1] or st[2] == 'deleted' then return -1 end
if st[3] ~= '1' then return 0 end
if st[1] ~= ARGV[2] then return -3 end

-- All checks are done; writes follow.
redis.call('HSET', rkey, 'paused', '0', 'ver', tonumber(st[1]) + 1)
if ARGV[3] ~= '' then
  redis.call('HSET', rkey, 'next', ARGV[3])
  redis.call('ZADD', P .. 'sdue', ARGV[3], id)
end
return 1
