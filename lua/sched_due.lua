-- sched_due: schedules whose next occurrence is at or before until_ms (read only).
--
-- KEYS[1]  bucket prefix "{<prefix>:<bucket>}:" (keys as in sched_put.lua)
-- ARGV[1]  until_ms (now + how far ahead occurrences are materialized)
-- ARGV[2]  limit, most schedules per call (the caller calls again when the reply is full)
-- ARGV[3]  optional: only schedules whose next occurrence is at or after this (default: any)
--
-- Reply: {n, then n times: id, ver, next}; n counts the ids read from the due index, of which
--        only live unpaused ones are returned (n == limit: call again after reserving)
local P = KEYS[1]
local ids = redis.call('ZRANGEBYSCORE', P .. 'sdue', ARGV[3] or '-inf', ARGV[1], 'LIMIT', 0,
                          ARGV[2])
local out = {#ids}
for _, id in ipairs(ids) do
  local st = redis.call('HMGET', P .. 's:' .. id, 'ver', 'state', 'paused', 'next')
  if st[1] and st[2] ~= 'deleted' and st[3] == '0' and st[4] then
    out[#out + 1] = id
    out[#out + 1] = st[1]
    out[#out + 1] = st[4]
  end
end
return out
