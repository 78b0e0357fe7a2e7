-- lib: record
-- sched_tombstone: make sure an occurrence's task can never be created, when it does not exist.
-- A reserved occurrence whose task is not created yet cannot be cancelled (no record); the
-- tombstone is that record, cancelled, so the creator's later create answers CONFLICT.
--
-- KEYS[1]  bucket prefix "{<prefix>:<bucket>}:" of the occurrence's task key
-- ARGV[1]  task key "<schedule id>.<occ ms>"
-- ARGV[2]  now_ms
-- ARGV[3]  retention_ms, how long the cancelled record stays readable (as lua/cancel.lua)
-- ARGV[4]  fp: a fingerprint no real request has ("tombstone"; stored zero-padded to 12
--          bytes, where a real one is a SHA-256 prefix), so a create never matches it
-- ARGV[5]  the record as for lua/schedule.lua (NewTask.fields()), so a replay of it is a
--          real task
--
-- Reply: SchedTombstoneReply (timewheel/store/replies.py)
--    1 WRITTEN      tombstone written
--    0 TASK_EXISTS  the task exists (the caller cancels it with Store.cancel)
local P = KEYS[1]
local key, now = ARGV[1], tonumber(ARGV[2])
local tkey = P .. 't:' .. key
if redis.call('EXISTS', tkey) == 1 then return 0 end

-- All checks are done; writes follow. Cancelled as lua/cancel.lua leaves a task, listed too.
local h = unpack_head(ARGV[5])
h[ST], h[FINISHED], h[CREATED] = 'c', now, now
h[FP] = string.sub(ARGV[4] .. string.rep('\0', 12), 1, 12)
redis.call('SET', tkey, ARGV[5])
put_head(tkey, h)
redis.call('PEXPIRE', tkey, ARGV[3])
add_finished(P, 'c', now, key)
return 1
