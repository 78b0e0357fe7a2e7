-- rekey_schedule: put a schedule's or a topic's spec, sealed anew by `timewheel keys rotate`
-- (timewheel/store/rotation.py), in place of the spec it read, only if the hash still holds
-- that spec (a PUT in between wrote another, sealed by its own process: it stays).
--
-- KEYS[1]  the prefix of the hash's slot: the schedule's bucket "{<prefix>:<bucket>}:", or the
--          topics' "{<prefix>:topics}:"
-- ARGV[1]  the rest of the hash's name: "s:<schedule id>" or "tp:<topic name>"
-- ARGV[2]  the spec as read
-- ARGV[3]  the new spec
--
-- Reply: RekeyScheduleReply (timewheel/store/replies.py)
--    1 REKEYED
--    0 CHANGED  the spec is not the one read any more: nothing written
local rkey = KEYS[1] .. ARGV[1]
if redis.call('HGET', rkey, 'spec') ~= ARGV[2] then return 0 end
redis.call('HSET', rkey, 'spec', ARGV[3])
return 1
