-- job_finish: a bulk job has ended (every bucket read to its end, or an error that no retry
-- mends): record its state and end time, take it off the running jobs, and let it expire
-- after the retention period, its per-bucket states with it (lua/job_step.lua).
--
-- KEYS[1]  the jobs' prefix "{<prefix>:jobs}:"
-- ARGV[1]  job id
-- ARGV[2]  holder: the runner's token
-- ARGV[3]  state: "done" or "failed"
-- ARGV[4]  now_ms
-- ARGV[5]  retention_ms
-- ARGV[6]  error ("" when done)
--
-- Reply: JobFinishReply (timewheel/store/replies.py)
--    1 FINISHED
--   -1 LOST       the job is not running, or another runner holds its lease: nothing written
local J = KEYS[1]
local id, holder = ARGV[1], ARGV[2]
local jkey = J .. 'j:' .. id
if not redis.call('ZSCORE', J .. 'running', id) or redis.call('HGET', jkey, 'holder') ~= holder then
  return -1
end
redis.call('ZREM', J .. 'running', id)
redis.call('HSET', jkey, 'state', ARGV[3], 'finished', ARGV[4], 'error', ARGV[6])
redis.call('PEXPIRE', jkey, tonumber(ARGV[5]))
return 1
