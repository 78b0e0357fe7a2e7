-- lib: slices
-- replay: schedule a failed or cancelled task again, now, with its attempts reset.
--
-- KEYS[1]  bucket prefix "{<prefix>:<bucket>}:"
-- ARGV[1]  task key
-- ARGV[2]  now_ms
-- ARGV[3]  request id, unique per API call: kept in the record ("op"), so the same call re-sent
--          by redis-py after a lost reply answers 1 again instead of -2
--
-- Reply:  1 scheduled again, -1 no such task, -2 not failed or cancelled
local P = KEYS[1]
local key = ARGV[1]
local now = tonumber(ARGV[2])
local tkey = P .. 't:' .. key

local st = redis.call('HMGET', tkey, 'status', 'op')
local status = st[1]
if not status then return -1 end
if st[2] == ARGV[3] then return 1 end
if status ~= 'failed' and status ~= 'cancelled' then return -2 end

local minute = slice_minute(P, now, now)
redis.call('PERSIST', tkey)
redis.call('ZREM', P .. 'dead', key)
redis.call('HDEL', tkey, 'finished')
redis.call('HSET', tkey, 'status', 'scheduled', 'attempts', 0, 'due', now, 'minute', minute,
  'op', ARGV[3])
redis.call('ZADD', P .. 'm:' .. minute, now, key)
redis.call('SREM', P .. 'd:' .. minute, key)
return 1
