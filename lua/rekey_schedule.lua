-- rekey_schedule: put a schedule's spec, sealed anew by `timewheel keys rotate`
-- (timewheel/store/rotation.py), in place of the spec it read, only if the schedule still holds
-- that spec (a PUT in between wrote another, sealed by its own process: it stays).
--
-- KEYS[1]  bucket prefix "{<prefix>:<bucket>}:" of the schedule
-- ARGV[1]  schedule id
-- ARGV[2]  the spec as read
-- ARGV[3]  the new spec
--
-- Reply: RekeyScheduleReply (timewheel/store/replies.py)
--    1 REKEYED
--    0 CHANGED  the spec is not the one read any more: nothing written
local rkey = KEYS[1] .. 's:' .. ARGV[1]
if redis.call('HGET', rkey, 'spec') ~= ARGV[2] then return 0 end
redis.call('HSET', rkey, 'spec', ARGV[3])
return 1
