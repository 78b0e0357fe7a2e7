-- lib: record, slices, parking, attempts, results
-- cancel: stop a task that has not finished. Lazy: the slice entry stays for the claimer to drop.
--
-- KEYS[1]  bucket prefix "{<prefix>:<bucket>}:"
-- ARGV[1]  task key
-- ARGV[2]  now_ms
-- ARGV[3]  retention_ms, how long the cancelled record stays readable
-- ARGV[4]  request id, unique per API call: its digest is kept in the record (op), so the
--          same call re-sent by redis-py after a lost reply answers 1 again instead of -2
-- ARGV[5]  kept: attempts kept per task (TIMEWHEEL_ATTEMPTS_KEPT)
--
-- Reply: CancelReply (timewheel/store/replies.py)
--    1 CANCELLED
--   -1 NOT_FOUND   no such task
--   -2 FINISHED    already finished
local P = KEYS[1]
local key = ARGV[1]
local now, retention, kept = tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[5])
local tkey = P .. 't:' .. key
local op = digest(ARGV[4])

local h, other = head(tkey)
if other then return old_layout(key) end
if not h then return -1 end
if h[ST] == 'c' and h[OP] == op then return 1 end
if FINISHED_INDEX[h[ST]] then return -2 end

local claim, started, stopped = NONE, 0, false
if h[ST] == 'd' then
  -- The holder's start check now fails: no attempt starts after this. An attempt already
  -- started keeps its claim, so that its answer still goes into the history (complete.lua).
  redis.call('ZREM', P .. 'ls', key)
  if h[STARTED] == 1 then claim, started = h[CLAIM], 1 else stopped = true end
elseif h[ST] == 'w' then
  -- Parked until its flow has room (lua/park.lua): no claim to drop, no slice entry.
  leave_parked(P, flow_of(tkey, h), key)
else
  redis.call('SADD', P .. 'md:' .. pending_minute(h[DUE], cursor_of(P)), key)
end
h[ST], h[FINISHED], h[OP], h[CLAIM], h[STARTED] = 'c', now, op, claim, started
put_head(tkey, h)
redis.call('PEXPIRE', tkey, retention)
redis.call('PEXPIRE', attempts_key(P, key), retention)  -- its history expires with it
expire_results(P, key, retention)
redis.call('ZADD', P .. 'fc', now, key)
if stopped then
  add_unanswered(P, key, h[ATT] + 1, 'cancelled', 'stopped by a DELETE before it was sent',
    kept, retention)
end
return 1
