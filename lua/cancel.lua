-- lib: record, slices, parking, attempts, results, cancelling, memory
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
if not cancellable(h) then return -2 end

go_on_when_full(P)
cancel_task(P, key, h, now, retention, op, kept)
return 1
