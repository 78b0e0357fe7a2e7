-- flow_limits: set (or clear) a flow's limits in one step, so that two PUTs racing each other
-- leave one of them whole, never a mix or nothing.
--
-- KEYS[1]  flow prefix "{<prefix>:f:<flow key>}:"
-- ARGV[1]  parallelism, or "" for none (the default applies)
-- ARGV[2]  rate in attempts per second, or "" for none
--
-- Reply: FlowLimitsReply (timewheel/store/replies.py)
--    1 LIMITED   a limit is now set
--    0 DEFAULTS  the flow is back to the defaults
local cfg = KEYS[1] .. 'cfg'
redis.call('DEL', cfg)
if ARGV[1] ~= '' then redis.call('HSET', cfg, 'p', ARGV[1]) end
if ARGV[2] ~= '' then redis.call('HSET', cfg, 'r', ARGV[2]) end
return redis.call('EXISTS', cfg)
