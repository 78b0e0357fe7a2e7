-- lib: slices
-- release: hand claims back that were never started (shutdown, or a start deadline missed),
-- so any process can claim them at once instead of after their lease.
--
-- KEYS[1]  bucket prefix "{<prefix>:<bucket>}:"
-- ARGV[1..] key, token pairs
--
-- Reply: one number per pair: 1 handed back, 0 not the caller's claim or already started
--        (an attempt that began keeps its lease: its outcome is unknown).
local P = KEYS[1]
local out = {}
for i = 1, #ARGV, 2 do
  local key, token = ARGV[i], ARGV[i + 1]
  local tkey = P .. 't:' .. key
  local st = redis.call('HMGET', tkey, 'claim', 'status', 'started', 'due', 'attempts')
  if st[1] ~= token or st[2] ~= 'delivering' or st[3] then
    out[#out + 1] = 0
  else
    local due = tonumber(st[4])
    local minute = slice_minute(P, due, due)
    local status = 'retrying'
    if tonumber(st[5]) == 0 then status = 'scheduled' end
    redis.call('ZREM', P .. 'lease', key)
    redis.call('HDEL', tkey, 'claim')
    redis.call('HSET', tkey, 'status', status, 'minute', minute)
    redis.call('ZADD', P .. 'm:' .. minute, due, key)
    redis.call('SREM', P .. 'd:' .. minute, key)
    out[#out + 1] = 1
  end
end
return out
