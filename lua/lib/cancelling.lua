-- Cancelling one task (lua/cancel.lua, lua/job_step.lua): the check, then the writes.
-- Lazy: the slice entry stays for the claimer to drop.

-- Whether a task in state h may be cancelled: it has not finished.
local function cancellable(h) return h ~= nil and not FINISHED_INDEX[h[ST]] end

-- Cancel a task whose head h passed `cancellable`. op: the digest of the request that cancels
-- (kept in the record); kept: attempts kept per task; retention_ms: how long the record stays.
local function cancel_task(P, key, h, now, retention, op, kept)
  local tkey = P .. 't:' .. key
  local claim, started, stopped = NONE, 0, false
  if h[ST] == 'd' then
    -- The holder's start check now fails: no attempt starts after this. An attempt already
    -- started keeps its claim, so that its answer still goes into the history (complete.lua),
    -- and its lease, so that when no answer comes it goes in as lost (claim.lua).
    if h[STARTED] == 1 then
      claim, started = h[CLAIM], 1
    else
      redis.call('ZREM', P .. 'ls', key)
      stopped = true
    end
  elseif h[ST] == 'w' then
    -- Parked until its flow has room (lua/park.lua): no claim to drop, no slice entry.
    leave_parked(P, flow_of(tkey, h), key)
  else
    redis.call('SADD', P .. 'md:' .. pending_minute(h[DUE], cursor_of(P)), key)
    -- Moved by a PATCH while its attempt was out (reschedule.lua kept the claim): as above.
    if h[STARTED] == 1 then claim, started = h[CLAIM], 1 end
  end
  h[ST], h[FINISHED], h[OP], h[CLAIM], h[STARTED] = 'c', now, op, claim, started
  put_head(tkey, h)
  redis.call('PEXPIRE', tkey, retention)
  redis.call('PEXPIRE', attempts_key(P, key), retention)  -- its history expires with it
  expire_results(P, key, retention)
  add_finished(P, 'c', now, key)
  if stopped then
    add_unanswered(P, key, h[ATT] + 1, 'cancelled', 'stopped by a DELETE before it was sent',
      kept, retention)
  end
end
