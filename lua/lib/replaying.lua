-- Replaying one task (lua/replay.lua, lua/job_step.lua): the check, then the writes.

-- Whether a task in state h may be replayed: it failed or was cancelled.
local function replayable(h) return h ~= nil and (h[ST] == 'f' or h[ST] == 'c') end

-- Schedule a task whose head h passed `replayable` again, now, with its attempts reset. Its
-- execute_at becomes now too: a cancelled task replayed before the time it was set for would
-- otherwise go out before its execute_at (and say so in its timewheel-scheduled-at header).
-- op: the digest of the request that replays (kept in the record).
local function replay_task(P, key, h, now, op)
  local tkey = P .. 't:' .. key
  local minute = slice_minute(P, now, now)
  redis.call('PERSIST', tkey)
  keep_attempts(P, key)
  keep_results(P, key)
  remove_finished(P, h[ST], h[FINISHED], key)
  h[ST], h[ATT], h[DUE], h[EXEC], h[FINISHED], h[OP] = 's', 0, now, now, 0, op
  -- A claim kept for an attempt cancelled in flight (lua/cancel.lua) is dropped with it.
  h[CLAIM], h[STARTED] = NONE, 0
  put_head(tkey, h)
  into_slice(P, key, now, minute)
end
