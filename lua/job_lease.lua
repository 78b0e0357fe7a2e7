-- job_lease: take or renew the lease on a running bulk job. A runner holds one job at a time
-- and renews its lease before each step; when its process dies, the lease expires and
-- another process's runner takes the job over and carries it on from the positions its
-- steps stored (lua/job_step.lua).
--
-- KEYS[1]  the jobs' prefix "{<prefix>:jobs}:"
-- ARGV[1]  now_ms
-- ARGV[2]  lease_ms
-- ARGV[3]  holder: the runner's token
-- ARGV[4]  job id to renew; "" to take any running job whose lease has expired (or was
--          never held), oldest lease first
--
-- Reply: the id of the job now held, or "" (none to take; or the job to renew has finished
-- or is held by another runner: this one lost it).
local J = KEYS[1]
local now, lease, holder, id = tonumber(ARGV[1]), tonumber(ARGV[2]), ARGV[3], ARGV[4]
local running = J .. 'running'
if id == '' then
  local free = redis.call('ZRANGEBYSCORE', running, '-inf', now, 'LIMIT', 0, 1)
  if #free == 0 then return '' end
  id = free[1]
else
  local expiry = tonumber(redis.call('ZSCORE', running, id))
  if not expiry then return '' end
  if redis.call('HGET', J .. 'j:' .. id, 'holder') ~= holder and expiry > now then
    return ''
  end
end
redis.call('ZADD', running, now + lease, id)
redis.call('HSET', J .. 'j:' .. id, 'holder', holder)
return id
