-- topic_put: create or replace a topic (PUT /topics/{name}).
--
-- KEYS[1]  the topics' prefix "{<prefix>:topics}:". Every topic shares this one slot: topics
--          are configuration, read one at a time by a publish, listed in name order.
--          P tp:<name>  hash: spec (JSON {"endpoints": [...]}, as the API validated it),
--                       created, updated (ms)
--          P n          zset: every topic's name, score 0 (the listing, by name)
-- ARGV[1]  name
-- ARGV[2]  spec
-- ARGV[3]  now_ms
--
-- Reply: TopicPutReply (timewheel/store/replies.py), as {code, created ms}
--    1 CREATED
--    0 REPLACED
local P = KEYS[1]
local name, spec, now = ARGV[1], ARGV[2], ARGV[3]
local tkey = P .. 'tp:' .. name
local created = redis.call('HGET', tkey, 'created')

-- No check can fail; writes follow.
redis.call('HSET', tkey, 'spec', spec, 'updated', now)
redis.call('ZADD', P .. 'n', 0, name)
if created then return {0, tonumber(created)} end
redis.call('HSET', tkey, 'created', now)
return {1, tonumber(now)}
