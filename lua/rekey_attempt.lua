-- rekey_attempt: put an attempt's history entry with its response body sealed anew by
-- `timewheel keys rotate` (timewheel/store/rotation.py) in place of the entry it read, only if
-- that entry is still in the task's history (appends and trims in between move it, so it is
-- found by value, not by index; an entry that is gone stays gone).
--
-- KEYS[1]  bucket prefix "{<prefix>:<bucket>}:"
-- ARGV[1]  task key
-- ARGV[2]  the entry as read
-- ARGV[3]  the new entry
--
-- Reply: RekeyAttemptReply (timewheel/store/replies.py)
--    1 REKEYED
--    0 GONE     the entry is not in the history any more: nothing written
local akey = KEYS[1] .. 'a:' .. ARGV[1]
local at = redis.call('LPOS', akey, ARGV[2])
if not at then return 0 end
redis.call('LSET', akey, at, ARGV[3])
return 1
