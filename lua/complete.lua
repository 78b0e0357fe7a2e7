-- lib: record, slices, attempts, results
-- complete: record the outcomes of attempts, with their history entries, and release their
-- claims, in one atomic step per batch; a task that finishes with a result callback gets its
-- result task in the same step.
--
-- KEYS[1..n]  bucket prefixes "{<prefix>:<bucket>}:". One on a Redis Cluster (each bucket is its
--             own slot; the client may add a guard key after it, ignored here); any number on a
--             single Redis, where one call records every bucket's outcomes (lua/start.lua).
-- ARGV[1]  now_ms
-- ARGV[2]  retention_ms: how long a finished record stays readable
-- ARGV[3]  kept: attempts kept per task (TIMEWHEEL_ATTEMPTS_KEPT)
-- ARGV[4]  n, the number of prefixes
-- ARGV[5..n+4] how many outcomes belong to each prefix, in KEYS order
-- ARGV[n+5..] the outcomes, prefix by prefix, nine values each:
--          key, token, outcome ("ok" | "retry" | "fail" | "spent": a failure because the
--          attempts ran out, which a PATCH that raised max_attempts may undo), status code
--          ("" for none),
--          error ("" for none), next due_ms (retry only, else ""), started_ms of the attempt,
--          the attempt's history entry (JSON, lua/lib/attempts.lua),
--          the record of its result task (timewheel/store/results.py: the task
--          "<key>.on_success" for "ok", "<key>.on_failure" for "fail", due now), "" for none
--
-- Reply: one CompleteReply per outcome (timewheel/store/replies.py)
--    1 RECORDED
--    0 STALE                the claim is no longer the caller's (replaced, or re-claimed
--                           after its lease ran out): nothing is written
--    2 CANCELLED_IN_FLIGHT  the task was cancelled while this attempt was in flight: it stays
--                           cancelled; the answer goes into its history (a retry there as
--                           failed: none follows) and last status, and a delivery creates its
--                           on_success result task
--    3 MOVED_IN_FLIGHT      the task was rescheduled (PATCH) while this attempt was in flight
--                           and the answer does not finish it: its history entry (a retry
--                           at the PATCH's time) and last status are written; the task stays
--                           at the PATCH's time (a delivery, an answer that is never retried,
--                           or a failure with the attempts used up, finishes it: RECORDED)
--
-- A finished task goes into its status's index (fs, ff: the dead letters) at now; claim
-- trims those indexes at the retention age, when the record expires.
--
-- The result task is created only with the RECORDED outcome that finishes its parent (or the
-- delivery of an attempt whose task was cancelled while it was out: CANCELLED_IN_FLIGHT), so a
-- call re-sent after a lost reply (STALE then) or an attempt re-sent after its lease ran out
-- (whose first answer was never recorded) creates it once. It is not created when a task of
-- its key exists already (a replayed task that finishes the same way again: the first
-- result's webhook-id is the same key, so receivers would drop a second anyway).
local now, retention, kept = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local SUFFIX = {ok = '.on_success', fail = '.on_failure'}

-- Each outcome's prefix and the index of its first value, in ARGV order.
local n = tonumber(ARGV[4])
local items, at = {}, n + 5
for k = 1, n do
  for _ = 1, tonumber(ARGV[4 + k]) do
    items[#items + 1] = {KEYS[k], at}
    at = at + 9
  end
end

-- Every check before the first write: a result record must be whole.
for _, item in ipairs(items) do
  local i = item[2]
  local rec = ARGV[i + 8] or ''
  if rec ~= '' then
    local r = unpack_head(rec)
    local kind = ARGV[i + 2] == 'spent' and 'fail' or ARGV[i + 2]
    if #rec ~= HEAD + r[FL] + r[UL] + r[HL] + r[BL] + r[EL] or not SUFFIX[kind] then
      return redis.error_reply('ERR complete: malformed result record for ' .. ARGV[i])
    end
  end
end

local function create_result(P, key, outcome, rec)
  local rkey = key .. SUFFIX[outcome]
  local rtkey = P .. 't:' .. rkey
  if redis.call('EXISTS', rtkey) == 1 then return end
  local r = unpack_head(rec)
  r[CREATED] = now
  redis.call('SET', rtkey, with_head(r, rec))
  into_slice(P, rkey, r[DUE], slice_minute(P, r[DUE], now))
end

local out = {}
local claims = {}  -- token -> its digest: a call's outcomes mostly share a few claim calls
for _, item in ipairs(items) do
  local P, i = item[1], item[2]
  local key, token, outcome = ARGV[i], ARGV[i + 1], ARGV[i + 2]
  local spent = outcome == 'spent'
  if spent then outcome = 'fail' end
  local code, err, due = ARGV[i + 3], ARGV[i + 4], tonumber(ARGV[i + 5])
  local entry, rec = ARGV[i + 7], ARGV[i + 8] or ''
  local tkey = P .. 't:' .. key
  local h = head(tkey)
  claims[token] = claims[token] or digest(token)
  local ours = h and h[CLAIM] == claims[token]
  -- Rescheduled in flight (lua/reschedule.lua keeps the claim of a started attempt for this):
  -- a delivery finishes the task, and so does an answer that is never retried (a 404) and a
  -- failure once the task's attempts are used up (max 0: its flow's default, which a PATCH
  -- cannot have raised); any other answer leaves it at the time the PATCH gave (a PATCH that
  -- raised max_attempts is not undone by a failure the executor judged spent against the old
  -- one), with the answer in its history and last status.
  local moved = ours and h[STARTED] == 1 and PENDING[h[ST]]
  local final = moved and (outcome == 'ok'
    or (outcome == 'fail' and (not spent or h[MAX] == 0 or h[ATT] >= h[MAX])))
  if ours and h[ST] == 'c' then
    -- Cancelled in flight (lua/cancel.lua keeps the claim and lease of a started attempt
    -- for this). The task stays cancelled, but this answer is its last attempt's: the record
    -- shows it, one that would have been retried has no next attempt (failed), and a
    -- delivery calls on_success, since the receiver has it. No on_failure: a cancelled task
    -- did not fail.
    redis.call('ZREM', P .. 'ls', key)
    h[CLAIM], h[STARTED] = NONE, 0
    h[LAST_AT], h[LAST_CODE] = tonumber(ARGV[i + 6]), tonumber(code) or 0
    put_with_err(tkey, h, err)
    if outcome == 'retry' then entry = amend_entry(entry, 'failed', nil) end
    if outcome == 'ok' and rec ~= '' then create_result(P, key, outcome, rec) end
    add_attempt(P, key, entry, kept, redis.call('PTTL', tkey))
    out[#out + 1] = 2
  elseif moved and not final then
    -- Its next attempt is at the PATCH's time, not at this answer's backoff (a failure the
    -- executor judged final under the old max_attempts is tried again there too).
    redis.call('ZREM', P .. 'ls', key)
    h[CLAIM], h[STARTED] = NONE, 0
    h[LAST_AT], h[LAST_CODE] = tonumber(ARGV[i + 6]), tonumber(code) or 0
    put_with_err(tkey, h, err)
    add_attempt(P, key, amend_entry(entry, 'retry', h[DUE]), kept, nil)
    out[#out + 1] = 3
  elseif not ours or (h[ST] ~= 'd' and not moved) or (outcome == 'retry' and not due) then
    out[#out + 1] = 0
  else
    redis.call('ZREM', P .. 'ls', key)
    if moved then  -- its entry in the PATCH's slice goes with the claimer, as a cancel's does
      redis.call('SADD', P .. 'md:' .. pending_minute(h[DUE], cursor_of(P)), key)
    end
    h[CLAIM], h[STARTED] = NONE, 0
    h[LAST_AT], h[LAST_CODE] = tonumber(ARGV[i + 6]), tonumber(code) or 0
    if outcome == 'retry' then
      local minute = slice_minute(P, due, now)
      h[ST], h[DUE] = 'r', due
      into_slice(P, key, due, minute)
    else
      h[ST], h[FINISHED] = outcome == 'ok' and 'o' or 'f', now
      add_finished(P, h[ST], now, key)
    end
    put_with_err(tkey, h, err)
    local ttl = nil
    if outcome ~= 'retry' then
      redis.call('PEXPIRE', tkey, retention)
      ttl = retention
      expire_results(P, key, retention)
      if rec ~= '' then create_result(P, key, outcome, rec) end
    end
    add_attempt(P, key, entry, kept, ttl)
    out[#out + 1] = 1
  end
end
return out
