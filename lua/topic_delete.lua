-- topic_delete: delete a topic (DELETE /topics/{name}), with its list of recent publishes.
-- The tasks its publishes made are not touched: each lives on its own.
--
-- KEYS[1]  the topics' prefix "{<prefix>:topics}:" (lua/topic_put.lua has the keys; P r:<name>
--          is the zset of the topic's recent publishes: publish key -> ms)
-- ARGV[1]  name
--
-- Reply: TopicDeleteReply (timewheel/store/replies.py)
--    1 DELETED
--   -1 NOT_FOUND
local P = KEYS[1]
local name = ARGV[1]
if redis.call('DEL', P .. 'tp:' .. name) == 0 then return -1 end

-- The check is done; writes follow.
redis.call('ZREM', P .. 'n', name)
redis.call('DEL', P .. 'r:' .. name)
return 1
