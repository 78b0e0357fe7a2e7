-- job_create: record a new bulk job (POST /tasks/cancel, /tasks/replay) and list it among the
-- running jobs, whose runners (timewheel/jobs/runner.py) take it from there.
--
-- KEYS[1]  the jobs' prefix "{<prefix>:jobs}:" (every job's own keys share its slot)
-- ARGV[1]  job id (new: a random id)
-- ARGV[2]  kind: "cancel" or "replay"
-- ARGV[3]  filter, as JSON (stored as given: the API validated it)
-- ARGV[4]  now_ms: the job's start
--
-- Keys: J j:<id> hash kind, filter, state (running, done, failed), started, finished, holder
-- (the token of the runner holding its lease), error; J running zset id -> lease expiry ms
-- (0: never held).
-- Reply: the job id.
local J = KEYS[1]
local id = ARGV[1]
redis.call('HSET', J .. 'j:' .. id, 'kind', ARGV[2], 'filter', ARGV[3], 'state', 'running',
  'started', ARGV[4], 'finished', '', 'holder', '', 'error', '')
redis.call('ZADD', J .. 'running', 0, id)
return id
