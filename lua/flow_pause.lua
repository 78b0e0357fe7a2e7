-- flow_pause: pause or resume a flow, keeping the rest of its configuration
-- (POST /flows/{key}/pause and /resume). lua/permits.lua grants no permit while the flow is
-- paused, so every process stops starting its attempts from its next permits call on.
--
-- KEYS[1]  flow prefix "{<prefix>:f:<flow key>}:"
-- ARGV[1]  "1" pause, "0" resume
--
-- Reply: FlowPauseReply (timewheel/store/replies.py)
--    1 CONFIGURED  the flow has a configuration left (paused, or limits or defaults set)
--    0 DEFAULTS    resumed, and nothing else was set: the flow is back to the defaults
local cfg = KEYS[1] .. 'cfg'
if ARGV[1] == '1' then
  redis.call('HSET', cfg, 'x', '1')
else
  redis.call('HDEL', cfg, 'x')
end
if redis.call('EXISTS', cfg) == 1 then return 1 end
return 0
