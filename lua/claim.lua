-- lib: claiming
-- claim: take up to `limit` tasks due at or before horizon_ms, under a lease.
--
-- KEYS[1]  bucket prefix "{<prefix>:<bucket>}:"
-- ARGV[1]  now_ms
-- ARGV[2]  horizon_ms: claim entries with due_ms <= horizon_ms (now + the coming tick + margin)
-- ARGV[3]  limit, most tasks per call (the caller loops while `more` is 1)
-- ARGV[4]  token, unique per call: the claim is recorded under it, so a retried call returns
--          the same tasks instead of claiming others
-- ARGV[5]  lease_margin_ms: lease = max(due, now) + task timeout + margin
-- ARGV[6]  max_minutes, most minute slices scanned per call (bounds the script after an outage)
-- ARGV[7]  retention_ms: dead letters older than this are dropped from the index
--
-- Reply: {more, n, then n times: key, due, and the CLAIM_FIELDS of lua/lib/claiming.lua}
--   more = 1 when the caller should call again (limit reached, a read window came back full,
--   or minutes left to scan).
--
-- Order: expired leases first (their process died: re-deliver), then the slices from the
-- cursor onwards. A slice entry is dropped without claiming when its key is in the minute's
-- delete-set or its record no longer points at this minute (cancelled, replaced, expired).
-- Past slices that drain are deleted with their delete-sets and the cursor moves past them.
local P = KEYS[1]
local now, horizon, limit = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local token, margin = ARGV[4], tonumber(ARGV[5])
local budget, retention = tonumber(ARGV[6]), tonumber(ARGV[7])
local record = P .. 'c:' .. token
local out = {0, 0}

-- A retry of a call whose reply was lost: hand back what it claimed and still holds.
if redis.call('EXISTS', record) == 1 then
  replay_claim(P, record, token, out)
  out[1] = 1
  return out
end

-- A window that came back full may hide more due entries behind dropped ones: call again.
local more = 0

-- 1. Leases that ran out: their holder died or stalled. Claim them again.
local expired = redis.call('ZRANGEBYSCORE', P .. 'lease', '-inf', now, 'LIMIT', 0, limit)
if #expired == limit then more = 1 end
for _, key in ipairs(expired) do
  local tkey = P .. 't:' .. key
  local st = redis.call('HMGET', tkey, 'status', 'due')
  if st[1] == 'delivering' then
    take(P, key, tonumber(st[2]), now, margin, token, record, out)
  else
    redis.call('ZREM', P .. 'lease', key)
  end
end

-- 2. The slices, oldest first.
local cursor = tonumber(redis.call('GET', P .. 'cursor'))
if cursor then
  local now_minute = math.floor(now / 60000)
  local last = math.floor(horizon / 60000)
  local m = cursor
  local scanned = 0
  while m <= last and out[2] < limit do
    if scanned >= budget then more = 1; break end
    scanned = scanned + 1
    local zkey, dkey = P .. 'm:' .. m, P .. 'd:' .. m
    local window = limit - out[2]
    local entries = redis.call('ZRANGEBYSCORE', zkey, '-inf', horizon, 'WITHSCORES', 'LIMIT', 0, window)
    if #entries == 2 * window then more = 1 end
    for i = 1, #entries, 2 do
      local key = entries[i]
      local tkey = P .. 't:' .. key
      redis.call('ZREM', zkey, key)
      if redis.call('SISMEMBER', dkey, key) == 0 then
        local st = redis.call('HMGET', tkey, 'status', 'minute')
        if (st[1] == 'scheduled' or st[1] == 'retrying') and tonumber(st[2]) == m then
          take(P, key, tonumber(entries[i + 1]), now, margin, token, record, out)
        end
      end
    end
    -- Only a past minute can be complete: nothing new is ever placed before the cursor.
    if m < now_minute and redis.call('EXISTS', zkey) == 0 then
      redis.call('DEL', dkey)
      if m == cursor then cursor = m + 1 end
    end
    m = m + 1
  end
  if out[2] >= limit then more = 1 end
  redis.call('SET', P .. 'cursor', cursor)
end

if out[2] > 0 then redis.call('PEXPIRE', record, 300000) end
redis.call('ZREMRANGEBYSCORE', P .. 'dead', '-inf', now - retention)
out[1] = more
return out
