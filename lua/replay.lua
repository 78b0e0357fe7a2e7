-- lib: record, slices, attempts, results, replaying, memory
-- replay: schedule a failed or cancelled task again, now, with its attempts reset.
--
-- KEYS[1]  bucket prefix "{<prefix>:<bucket>}:"
-- ARGV[1]  task key
-- ARGV[2]  now_ms
-- ARGV[3]  request id, unique per API call: its digest is kept in the record (op), so the
--          same call re-sent by redis-py after a lost reply answers 1 again instead of -2
--
-- Reply: ReplayReply (timewheel/store/replies.py)
--    1 REPLAYED    scheduled again
--   -1 NOT_FOUND   no such task
--   -2 NOT_FAILED  neither failed nor cancelled
local P = KEYS[1]
local key = ARGV[1]
local now = tonumber(ARGV[2])
local tkey = P .. 't:' .. key
local op = digest(ARGV[3])

local h, other = head(tkey)
if other then return old_layout(key) end
if not h then return -1 end
if h[OP] == op then return 1 end
if not replayable(h) then return -2 end

-- Its first write (PERSIST) is one Redis does not check when full: refused as a whole
-- instead, as a creation is (lua/lib/memory.lua), not run past the limit.
refuse_when_full(P)
replay_task(P, key, h, now, op)
return 1
