-- lib: slices
-- schedule: create a task, or replace one that has not finished.
--
-- KEYS[1]  bucket prefix "{<prefix>:<bucket>}:". Every key below is derived from it, so all of
--          one task's keys share one hash slot (the minute slices cannot be listed up front).
-- ARGV[1]  task key
-- ARGV[2]  mode: "create" (POST) or "replace" (PUT)
-- ARGV[3]  now_ms
-- ARGV[4]  due_ms, when the first attempt may start
-- ARGV[5]  fp, fingerprint of the request content (idempotent POST)
-- ARGV[6]  request id, unique per API call: kept in the record ("op") with the reply, so the
--          same call re-sent by redis-py after a lost reply answers as before and writes
--          nothing (a replace must not re-arm a task claimed or finished in between)
-- ARGV[7..] field, value pairs of the task record (url, method, headers, body, exec, max,
--          backoff, timeout, flow)
--
-- Reply:  0 created, 1 replaced, 2 an identical task exists (create only),
--        -1 conflict: the key exists with other content (create only)
local P = KEYS[1]
local key, mode, fp, req = ARGV[1], ARGV[2], ARGV[5], ARGV[6]
local now, due = tonumber(ARGV[3]), tonumber(ARGV[4])
local tkey = P .. 't:' .. key

local old = redis.call('HMGET', tkey, 'status', 'minute', 'fp', 'op', 'flow')
local status = old[1]
if old[4] and string.sub(old[4], 1, #req + 1) == req .. '=' then
  return tonumber(string.sub(old[4], #req + 2))
end
if status and mode == 'create' then
  if old[3] == fp then return 2 end
  return -1
end
local finished = status == 'succeeded' or status == 'failed' or status == 'cancelled'

-- All checks are done; writes follow.
local reply = 0
if status and not finished then
  reply = 1
  if status == 'delivering' then
    -- Claimed: dropping the claim token turns the holder's start/complete into no-ops.
    redis.call('ZREM', P .. 'lease', key)
  elseif status == 'waiting' then
    redis.call('ZREM', P .. 'w:' .. old[5], key)
  else
    redis.call('SADD', P .. 'd:' .. old[2], key)
  end
end
if status == 'failed' then redis.call('ZREM', P .. 'dead', key) end

local minute = slice_minute(P, due, now)

redis.call('DEL', tkey)
redis.call('HSET', tkey, 'status', 'scheduled', 'due', due, 'minute', minute, 'attempts', 0,
  'created', now, 'fp', fp, 'op', req .. '=' .. reply, unpack(ARGV, 7))
redis.call('ZADD', P .. 'm:' .. minute, due, key)
redis.call('SREM', P .. 'd:' .. minute, key)
return reply
