-- waiting_report: one process's count of the attempts it holds in memory waiting for their
-- flow (refused a permit: a limit or a pause), per flow, written once a tick. GET /flows adds
-- them up over the live processes (lua/waiting_count.lua) to the tasks parked in Redis.
--
-- KEYS[1]  report prefix "{<prefix>:wl}:" (one hash slot for every process's report)
-- ARGV[1]  now_ms
-- ARGV[2]  ttl_ms: the report counts until now + ttl_ms unless written again (a process that
--          dies stops counting then)
-- ARGV[3]  the process's id (unique per process start)
-- ARGV[4..] flow, count pairs (counts > 0); none: the process holds no waiter, its report
--          is removed
--
-- Reply: the number of live reports left (this one included).
--
-- Keys: live (zset process id -> report expiry ms), p:<process id> (hash flow -> count,
-- expiring with its entry in live).
local P = KEYS[1]
local now, ttl, proc = tonumber(ARGV[1]), tonumber(ARGV[2]), ARGV[3]
local live, mine = P .. 'live', P .. 'p:' .. proc
redis.call('ZREMRANGEBYSCORE', live, '-inf', now)
redis.call('DEL', mine)
if #ARGV >= 5 then
  for i = 4, #ARGV, 2 do redis.call('HSET', mine, ARGV[i], ARGV[i + 1]) end
  redis.call('PEXPIRE', mine, ttl)
  redis.call('ZADD', live, now + ttl, proc)
  redis.call('PEXPIRE', live, ttl)
else
  redis.call('ZREM', live, proc)
end
return redis.call('ZCARD', live)
