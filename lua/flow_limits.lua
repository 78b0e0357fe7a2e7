-- lib: memory
-- flow_limits: set (or clear) a flow's configuration in one step, so that two PUTs racing each
-- other leave one of them whole, never a mix or nothing. PUT replaces it all: a field not
-- given is cleared (a PUT without "paused": true resumes the flow).
--
-- KEYS[1]  flow prefix "{<prefix>:f:<flow key>}:"
-- ARGV[1]  parallelism, or "" for none (the default applies)
-- ARGV[2]  rate in attempts per second, or "" for none
-- ARGV[3]  "1" paused, or "" not paused
-- ARGV[4]  max_attempts default of the flow's tasks, or "" for none
-- ARGV[5]  retry_backoff default in ms, or "" for none
-- ARGV[6]  max_backoff in ms (the cap of every retry delay of the flow), or "" for none
--          (arguments left out count as "")
--
-- Reply: FlowLimitsReply (timewheel/store/replies.py)
--    1 LIMITED   something is set (a limit, a pause or a retry default)
--    0 DEFAULTS  the flow is back to the defaults
local cfg = KEYS[1] .. 'cfg'
local given = {}
for i, field in ipairs({'p', 'r', 'x', 'ma', 'rb', 'mb'}) do
  if ARGV[i] and ARGV[i] ~= '' then
    given[#given + 1] = field
    given[#given + 1] = ARGV[i]
  end
end
if #given == 0 then
  redis.call('DEL', cfg)
  return 0
end
refuse_when_full(KEYS[1])
redis.call('DEL', cfg)
redis.call('HSET', cfg, unpack(given))
return 1
