-- lib: record, slices, parking, memory
-- reschedule: move a task that has not finished to a new due time (PATCH /tasks/{key}),
-- keeping its request (url, method, headers, body, flow, timeout, backoff), its attempts so
-- far and its fingerprint; optionally a new max_attempts.
--
-- A pending task's entry moves from its slice to the new minute's (the old entry is marked in
-- the old minute's delete-set for the claimer to drop, as cancel and replace do). A task parked
-- for its flow leaves the flow's waiting sets for the new slice. A claimed task whose attempt
-- has not started loses its claim and lease, so the holder's start check fails and nothing is
-- sent. An attempt already started keeps its claim and lease, as a cancel keeps the claim, so
-- that its answer still goes into the history (complete.lua), or, if it was not sent after
-- all, its count is taken back (release.lua, park.lua); the task is due again at the time
-- asked for, or when that lease ends if later.
--
-- KEYS[1]  bucket prefix "{<prefix>:<bucket>}:"
-- ARGV[1]  task key
-- ARGV[2]  now_ms
-- ARGV[3]  request id, unique per API call: its digest is kept in the record (op), so the
--          same call re-sent by redis-py after a lost reply answers 1 again
-- ARGV[4]  the new due time, ms (becomes execute_at too)
-- ARGV[5]  the new max_attempts, or "" to keep it
--
-- Reply: RescheduleReply (timewheel/store/replies.py)
--    1 RESCHEDULED
--   -1 NOT_FOUND         no such task
--   -2 FINISHED          already finished
--   -3 TOO_FEW_ATTEMPTS  max_attempts is not more than the attempts already made (nothing
--                        written)
local P = KEYS[1]
local key, now = ARGV[1], tonumber(ARGV[2])
local due, max = tonumber(ARGV[4]), tonumber(ARGV[5])
local tkey = P .. 't:' .. key
local op = digest(ARGV[3])

local h, other = head(tkey)
if other then return old_layout(key) end
if not h then return -1 end
if h[OP] == op then return 1 end
if FINISHED_INDEX[h[ST]] then return -2 end
if max and max <= h[ATT] then return -3 end

-- A started attempt may still be out: the task keeps its claim and its lease entry, and is not
-- due again before that lease ends (by then its answer has come, or it counts as lost), so
-- two of its attempts are never out at once. Its execute_at is the time asked for.
local out_until = nil
if h[STARTED] == 1 then out_until = tonumber(redis.call('ZSCORE', P .. 'ls', key)) end
local next_due = due
if out_until and out_until > next_due then next_due = out_until end

-- All checks are done; writes follow, the first of them perhaps a removal: refused as a
-- whole when Redis is full (lua/lib/memory.lua), not run past its limit.
refuse_when_full(P)
if h[ST] == 'd' then
  if h[STARTED] ~= 1 then redis.call('ZREM', P .. 'ls', key) end
elseif h[ST] == 'w' then
  leave_parked(P, flow_of(tkey, h), key)
else
  redis.call('SADD', P .. 'md:' .. pending_minute(h[DUE], cursor_of(P)), key)
end
local minute = slice_minute(P, next_due, now)
if h[STARTED] ~= 1 then h[CLAIM], h[STARTED] = NONE, 0 end
h[ST] = h[ATT] == 0 and 's' or 'r'
h[DUE], h[EXEC], h[OP] = next_due, due, op
if max then h[MAX] = max end
put_head(tkey, h)
into_slice(P, key, next_due, minute)
return 1
