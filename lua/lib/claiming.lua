-- Claim replies: {more, n, then n times: key, due, and the CLAIM_FIELDS of the record}.
local CLAIM_FIELDS = {'exec', 'attempts', 'max', 'backoff', 'timeout', 'url', 'method',
  'headers', 'body', 'flow'}

local function emit(out, key, due, fields)
  out[#out + 1] = key
  out[#out + 1] = due
  for i = 1, #CLAIM_FIELDS do out[#out + 1] = fields[i] end
  out[2] = out[2] + 1
end

-- Lease a task to `token` until max(due, now) + its timeout + margin, and note it in the
-- call's record list (so a re-sent call returns the same tasks).
local function take(P, key, due, now, margin, token, record, out)
  local tkey = P .. 't:' .. key
  local f = redis.call('HMGET', tkey, unpack(CLAIM_FIELDS))
  redis.call('ZADD', P .. 'lease', math.max(due, now) + tonumber(f[5]) + margin, key)
  redis.call('HSET', tkey, 'status', 'delivering', 'claim', token)
  redis.call('HDEL', tkey, 'started')
  redis.call('RPUSH', record, key)
  emit(out, key, due, f)
end

-- A call re-sent after its reply was lost: hand back what it took and still holds.
local function replay_claim(P, record, token, out)
  for _, key in ipairs(redis.call('LRANGE', record, 0, -1)) do
    local tkey = P .. 't:' .. key
    local st = redis.call('HMGET', tkey, 'claim', 'due')
    if st[1] == token then
      emit(out, key, tonumber(st[2]), redis.call('HMGET', tkey, unpack(CLAIM_FIELDS)))
    end
  end
end
