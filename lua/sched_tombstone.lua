-- sched_tombstone: make sure an occurrence's task can never be created, when it does not exist.
-- A reserved occurrence whose task is not created yet cannot be cancelled (no record); the
-- tombstone is that record, cancelled, so the creator's later create answers CONFLICT.
--
-- KEYS[1]  bucket prefix "{<prefix>:<bucket>}:" of the occurrence's task key
-- ARGV[1]  task key "<schedule id>.<occ ms>"
-- ARGV[2]  now_ms
-- ARGV[3]  retention_ms, how long the cancelled record stays readable (as lua/cancel.lua)
-- ARGV[4]  fp: a fingerprint no real request has ("tombstone"), so a create never matches it
-- ARGV[5..] field, value pairs of the task record (url, method, headers, body, exec, max,
--          backoff, timeout, ...: as for lua/schedule.lua, so a replay of it is a real task)
--
-- Reply: 1 tombstone written, 0 the task exists (the caller cancels it with Store.cancel)
local P = KEYS[1]
local tkey = P .. 't:' .. ARGV[1]
if redis.call('EXISTS', tkey) == 1 then return 0 end

-- All checks are done; writes follow.
local now = ARGV[2]
redis.call('HSET', tkey, 'status', 'cancelled', 'finished', now, 'created', now, 'attempts', 0,
  'fp', ARGV[4], unpack(ARGV, 5))
redis.call('PEXPIRE', tkey, ARGV[3])
return 1
