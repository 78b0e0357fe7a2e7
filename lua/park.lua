-- park: set claimed tasks aside until their flow has room (lua/permits.lua said no).
--
-- A parked task holds no lease and sits in no minute slice, so neither the claim path nor a
-- lease running out touches it: waiting costs one sorted-set entry, however long it lasts.
-- lua/unpark.lua takes it back once a permit is free.
--
-- KEYS[1]  bucket prefix "{<prefix>:<bucket>}:"
-- ARGV[1..] key, token pairs: claims of the caller, not yet started
--
-- Reply: one number per pair: 1 parked, 0 not the caller's claim any more or already started
--        (cancelled, replaced, re-claimed): nothing written.
--
-- Keys: w:<flow> (zset task key -> due_ms, the flow's waiting tasks of this bucket, in due
-- order), wf (zset flow -> due_ms of its earliest waiting task in this bucket).
local P = KEYS[1]
local out = {}
for i = 1, #ARGV, 2 do
  local key, token = ARGV[i], ARGV[i + 1]
  local tkey = P .. 't:' .. key
  local st = redis.call('HMGET', tkey, 'claim', 'status', 'started', 'due', 'flow')
  if st[1] ~= token or st[2] ~= 'delivering' or st[3] then
    out[#out + 1] = 0
  else
    local wkey = P .. 'w:' .. st[5]
    redis.call('ZREM', P .. 'lease', key)
    redis.call('HDEL', tkey, 'claim')
    redis.call('HSET', tkey, 'status', 'waiting')
    redis.call('ZADD', wkey, tonumber(st[4]), key)
    local head = redis.call('ZRANGE', wkey, 0, 0, 'WITHSCORES')
    redis.call('ZADD', P .. 'wf', tonumber(head[2]), st[5])
    out[#out + 1] = 1
  end
end
return out
