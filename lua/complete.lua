-- lib: slices
-- complete: record the outcomes of attempts and release their claims.
--
-- KEYS[1]  bucket prefix "{<prefix>:<bucket>}:"
-- ARGV[1]  now_ms
-- ARGV[2]  retention_ms: how long a finished record stays readable
-- ARGV[3..] seven values per outcome:
--          key, token, outcome ("ok" | "retry" | "fail"), status code ("" for none),
--          error ("" for none), next due_ms (retry only, else ""), started_ms of the attempt
--
-- Reply: one number per outcome: 1 recorded, 0 stale (the claim is no longer the caller's:
--        cancelled, replaced or re-claimed after its lease ran out; nothing is written).
local P = KEYS[1]
local now, retention = tonumber(ARGV[1]), tonumber(ARGV[2])
local out = {}
for i = 3, #ARGV, 7 do
  local key, token, outcome = ARGV[i], ARGV[i + 1], ARGV[i + 2]
  local code, err, due = ARGV[i + 3], ARGV[i + 4], tonumber(ARGV[i + 5])
  local started = ARGV[i + 6]
  local tkey = P .. 't:' .. key
  local st = redis.call('HMGET', tkey, 'claim', 'status')
  if st[1] ~= token or st[2] ~= 'delivering' or (outcome == 'retry' and not due) then
    out[#out + 1] = 0
  else
    redis.call('ZREM', P .. 'lease', key)
    redis.call('HDEL', tkey, 'claim', 'started', 'last_code', 'last_err')
    redis.call('HSET', tkey, 'last_at', started)
    if code ~= '' then redis.call('HSET', tkey, 'last_code', code) end
    if err ~= '' then redis.call('HSET', tkey, 'last_err', err) end
    if outcome == 'retry' then
      local minute = slice_minute(P, due, now)
      redis.call('HSET', tkey, 'status', 'retrying', 'due', due, 'minute', minute)
      redis.call('ZADD', P .. 'm:' .. minute, due, key)
      redis.call('SREM', P .. 'd:' .. minute, key)
    else
      if outcome == 'ok' then
        redis.call('HSET', tkey, 'status', 'succeeded', 'finished', now)
      else
        redis.call('HSET', tkey, 'status', 'failed', 'finished', now)
        redis.call('ZADD', P .. 'dead', now, key)
      end
      redis.call('PEXPIRE', tkey, retention)
    end
    out[#out + 1] = 1
  end
end
return out
