-- lib: record, slices, attempts
-- release: hand back claims whose attempt was never sent, so any process can claim them at
-- once instead of after their lease: a start deadline missed, a process stalled past its
-- lease, a start call whose reply was lost while Redis was away, or shutdown.
--
-- KEYS[1]  bucket prefix "{<prefix>:<bucket>}:"
-- ARGV[1]  kept: attempts kept per task (TIMEWHEEL_ATTEMPTS_KEPT)
-- ARGV[2..] key, token pairs: only the holder of a claim calls this, and only for an attempt
--          it did not send, so a started one (lua/start.lua counted it) is uncounted again
--
-- Reply: one ReleaseReply per pair (timewheel/store/replies.py)
--    1 HANDED_BACK
--    0 STALE        not the caller's claim any more (replaced, or re-claimed after its lease
--                   ran out): nothing written
--    2 CANCELLED    the task was cancelled while it held the claim: its history says so,
--                   nothing else is written
--    3 MOVED        the task was rescheduled (PATCH) after its attempt started: it was not
--                   sent after all, so its count is taken back; it stays at its new time
local P = KEYS[1]
local kept = tonumber(ARGV[1])
local out = {}
for i = 2, #ARGV, 2 do
  local key = ARGV[i]
  local tkey = P .. 't:' .. key
  local h = head(tkey)
  if not h or h[CLAIM] ~= digest(ARGV[i + 1]) then
    out[#out + 1] = 0
  elseif h[ST] == 'c' then
    cancelled_unsent(P, key, tkey, h, kept)  -- cancelled after it started: not sent after all
    out[#out + 1] = 2
  elseif moved_in_flight(h, h[CLAIM]) then
    -- Rescheduled after it started: it was not sent after all.
    moved_unsent(P, key, tkey, h)
    out[#out + 1] = 3
  elseif h[ST] ~= 'd' then
    out[#out + 1] = 0
  else
    local minute = slice_minute(P, h[DUE], h[DUE])
    redis.call('ZREM', P .. 'ls', key)
    if h[STARTED] == 1 then h[ATT] = h[ATT] - 1 end
    h[ST] = h[ATT] == 0 and 's' or 'r'
    h[CLAIM], h[STARTED] = NONE, 0
    put_head(tkey, h)
    into_slice(P, key, h[DUE], minute)
    out[#out + 1] = 1
  end
end
return out
