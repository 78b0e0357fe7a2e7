-- lib: record, parking, attempts
-- park: set claimed tasks aside until their flow has room (lua/permits.lua said no).
--
-- A parked task holds no lease and sits in no minute slice, so neither the claim path nor a
-- lease running out touches it: waiting costs two sorted-set entries, however long it lasts.
-- lua/unpark.lua takes it back once a permit is free.
--
-- KEYS[1]  bucket prefix "{<prefix>:<bucket>}:"
-- ARGV[1]  kept: attempts kept per task (TIMEWHEEL_ATTEMPTS_KEPT)
-- ARGV[2..] key, token pairs: claims of the caller whose attempt it did not send; one that
--          lua/start.lua counted already (a rated flow's attempt that asked again) is
--          uncounted, as lua/release.lua does
--
-- Reply: one ParkReply per pair (timewheel/store/replies.py)
--    1 PARKED
--    0 STALE   not the caller's claim any more (cancelled, replaced, re-claimed): nothing
--              written; or its task was rescheduled after the attempt started, which then
--              leaves the count (lib/record.lua moved_unsent); or cancelled after the
--              attempt started (lib/cancelling.lua kept its claim and lease): its claim and
--              lease go and its history says it was stopped before it was sent, as
--              lua/release.lua writes it (left alone, the lease ran out and claim.lua
--              recorded an attempt no process sent as lost)
--
-- Keys: pw:<flow> (zset task key -> due_ms, the flow's parked tasks of this bucket, in due
-- order), pf (zset flow -> due_ms of its earliest parked task in this bucket), pa (zset task
-- key -> due_ms, every parked task of the bucket: the listings read it).
local P = KEYS[1]
local kept = tonumber(ARGV[1])
local out = {}
for i = 2, #ARGV, 2 do
  local key = ARGV[i]
  local tkey = P .. 't:' .. key
  local h = head(tkey)
  local claim = digest(ARGV[i + 1])
  if moved_in_flight(h, claim) then
    -- Rescheduled after it started: not sent, and no longer the holder's to park.
    moved_unsent(P, key, tkey, h)
    out[#out + 1] = 0
  elseif h and h[ST] == 'c' and h[CLAIM] == claim then
    cancelled_unsent(P, key, tkey, h, kept)  -- cancelled after it started: not sent after all
    out[#out + 1] = 0
  elseif not h or h[ST] ~= 'd' or h[CLAIM] ~= claim then
    out[#out + 1] = 0
  else
    local flow = flow_of(tkey, h)
    redis.call('ZREM', P .. 'ls', key)
    if h[STARTED] == 1 then h[ATT] = h[ATT] - 1 end
    h[ST], h[CLAIM], h[STARTED] = 'w', NONE, 0
    put_head(tkey, h)
    redis.call('ZADD', P .. 'pw:' .. flow, h[DUE], key)
    redis.call('ZADD', P .. 'pa', h[DUE], key)
    index_parked_flow(P, flow)
    out[#out + 1] = 1
  end
end
return out
