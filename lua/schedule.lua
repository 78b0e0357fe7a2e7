-- lib: record, slices, parking, attempts, results, creating
-- schedule: create a task, or replace one that has not finished.
--
-- KEYS[1]  bucket prefix "{<prefix>:<bucket>}:". Every key below is derived from it, so all of
--          one task's keys share one hash slot (the minute slices cannot be listed up front).
-- ARGV[1]  task key
-- ARGV[2]  mode: "create" (POST) or "replace" (PUT)
-- ARGV[3]  now_ms
-- ARGV[4]  request id, unique per API call: its digest and the reply are kept in the record
--          (op, opr), so the same call re-sent by redis-py after a lost reply answers as
--          before and writes nothing (a replace must not re-arm a task claimed or finished in
--          between)
-- ARGV[5]  the record as timewheel/store/layout.py `template` builds it (status scheduled, due,
--          fingerprint, request); this script sets its created time and request id
-- ARGV[6]  optional: the task's result callbacks' URLs as lua/lib/results.lua stores them,
--          "" or absent for none (a replace or re-create without any drops the old ones)
--
-- Reply: ScheduleReply (timewheel/store/replies.py)
--    0 CREATED
--    1 REPLACED
--    2 EXISTS    an identical task exists (create only)
--   -1 CONFLICT  the key exists with other content (create only)
local P = KEYS[1]
local key, mode, now, req, new = ARGV[1], ARGV[2], tonumber(ARGV[3]), ARGV[4], ARGV[5]
local results = ARGV[6] or ''
local tkey = P .. 't:' .. key
local op = digest(req)

local h = new_head(new)
if not h then return redis.error_reply('ERR schedule: malformed record for ' .. key) end
local old, other = head(tkey)
if other then return old_layout(key) end
if old and old[OP] == op then return old[OPR] end
if old and mode == 'create' then
  if old[FP] == h[FP] then return 2 end
  return -1
end
local status = old and old[ST]
local finished = FINISHED_INDEX[status]

-- All checks are done; writes follow.
local reply = 0
if old and not finished then
  reply = 1
  if status == 'd' then
    -- Claimed: the new record has no claim, so the holder's start and complete find none.
    redis.call('ZREM', P .. 'ls', key)
  elseif status == 'w' then
    leave_parked(P, flow_of(tkey, old), key)
  else
    redis.call('SADD', P .. 'md:' .. pending_minute(old[DUE], cursor_of(P)), key)
  end
elseif finished then
  redis.call('ZREM', P .. finished, key)
  keep_attempts(P, key)  -- created again: its history goes on, no longer expiring
end

write_task(P, key, new, h, now, op, reply, results, old ~= nil)
return reply
