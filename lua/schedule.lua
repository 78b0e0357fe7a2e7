-- lib: record, slices, parking, attempts, results, creating, memory
-- schedule: create tasks, or replace tasks that have not finished: one (POST, PUT) or many of
-- one bucket (POST /tasks/batch, a recurring schedule's occurrences), each as if alone, in the
-- order given.
--
-- KEYS[1]  bucket prefix "{<prefix>:<bucket>}:". Every key below is derived from it, so all of
--          the tasks' keys share one hash slot (the minute slices cannot be listed up front).
-- ARGV[1]  mode: "create" (POST) or "replace" (PUT), for every task of the call; a replace
--          call names each key once (a record keeps only its last request id, so a re-sent
--          call could not tell an earlier replace of the same key as done)
-- ARGV[2]  now_ms
-- ARGV[3..] per task, four values:
--          its key;
--          its request id, unique per API call and task: its digest and the reply are kept in
--          the record (op, opr), so the same call re-sent by redis-py after a lost reply answers
--          as before and writes nothing (a replace must not re-arm a task claimed or finished
--          in between);
--          its record as timewheel/store/layout.py `template` builds it (status scheduled, due,
--          fingerprint, request); this script sets its created time and request id;
--          its result callbacks' URLs as lua/lib/results.lua stores them, "" for none (a replace
--          or re-create without any drops the old ones)
--
-- Reply: a ScheduleReply (timewheel/store/replies.py) per task, in order
--    0 CREATED
--    1 REPLACED
--    2 EXISTS    an identical task exists (create only)
--   -1 CONFLICT  the key exists with other content (create only)
local P = KEYS[1]
local mode, now = ARGV[1], tonumber(ARGV[2])

-- Every check that can refuse the call comes first: malformed arguments or a malformed
-- record, a key given twice to replace, a key of the v1 layout. Nothing is written when one
-- does.
if (mode ~= 'create' and mode ~= 'replace') or not now or (#ARGV - 2) % 4 ~= 0 then
  return redis.error_reply('ERR schedule: malformed arguments')
end
local news, olds, named = {}, {}, {}
for i = 3, #ARGV, 4 do
  local key = ARGV[i]
  local h = new_head(ARGV[i + 2])
  if not h then return redis.error_reply('ERR schedule: malformed record for ' .. key) end
  if mode == 'replace' and named[key] then
    return redis.error_reply('ERR schedule: ' .. key .. ' given twice to replace')
  end
  named[key] = true
  local old, other = head(P .. 't:' .. key)
  if other then return old_layout(key) end
  news[i], olds[i] = h, old or false
end

-- One task, given its record's head as it is now (nil: none): decided, then written.
local function schedule(key, req, new, h, old, results)
  local tkey = P .. 't:' .. key
  local op = digest(req)
  if old and old[OP] == op then return old[OPR] end
  if old and mode == 'create' then
    if old[FP] == h[FP] then return 2 end
    return -1
  end
  local status = old and old[ST]
  local finished = FINISHED_INDEX[status]

  -- This task's checks are done; its writes follow (a replace removes before it adds).
  local reply = 0
  if old then refuse_when_full(P) end
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
    remove_finished(P, status, old[FINISHED], key)
    keep_attempts(P, key)  -- created again: its history goes on, no longer expiring
  end

  write_task(P, key, new, h, now, op, reply, results, old ~= nil)
  return reply
end

-- A key given again in this call is read again: its first occurrence may have written it.
local replies, seen = {}, {}
for i = 3, #ARGV, 4 do
  local key = ARGV[i]
  local old = olds[i] or nil
  if seen[key] then old = head(P .. 't:' .. key) end
  seen[key] = true
  replies[#replies + 1] = schedule(key, ARGV[i + 1], ARGV[i + 2], news[i], old, ARGV[i + 3])
end
return replies
