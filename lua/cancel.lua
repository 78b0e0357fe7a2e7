-- cancel: stop a task that has not finished. Lazy: the slice entry stays for the claimer to drop.
--
-- KEYS[1]  bucket prefix "{<prefix>:<bucket>}:"
-- ARGV[1]  task key
-- ARGV[2]  now_ms
-- ARGV[3]  retention_ms, how long the cancelled record stays readable
-- ARGV[4]  request id, unique per API call: kept in the record ("op"), so the same call re-sent
--          by redis-py after a lost reply answers 1 again instead of -2
--
-- Reply:  1 cancelled, -1 no such task, -2 already finished
local P = KEYS[1]
local key = ARGV[1]
local now, retention = tonumber(ARGV[2]), tonumber(ARGV[3])
local tkey = P .. 't:' .. key

local st = redis.call('HMGET', tkey, 'status', 'minute', 'op', 'flow')
if not st[1] then return -1 end
if st[1] == 'cancelled' and st[3] == ARGV[4] then return 1 end
if st[1] == 'succeeded' or st[1] == 'failed' or st[1] == 'cancelled' then return -2 end

if st[1] == 'delivering' then
  -- Dropping the claim token makes the holder's start check fail: no attempt starts after this.
  redis.call('ZREM', P .. 'lease', key)
elseif st[1] == 'waiting' then
  -- Parked until its flow has room (lua/park.lua): no claim to drop, no slice entry.
  redis.call('ZREM', P .. 'w:' .. st[4], key)
else
  redis.call('SADD', P .. 'd:' .. st[2], key)
end
redis.call('HDEL', tkey, 'claim', 'started')
redis.call('HSET', tkey, 'status', 'cancelled', 'finished', now, 'op', ARGV[4])
redis.call('PEXPIRE', tkey, retention)
return 1
