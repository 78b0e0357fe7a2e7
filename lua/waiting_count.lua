-- waiting_count: read-only; per flow, the attempts that live processes hold in memory waiting
-- for it, summed over their reports (lua/waiting_report.lua).
--
-- KEYS[1]  report prefix "{<prefix>:wl}:"
-- ARGV[1]  now_ms: reports that ran out before it are not counted
-- ARGV[2..] flow keys
--
-- Reply: one count per flow, in the order asked.
local P = KEYS[1]
local now = tonumber(ARGV[1])
local out = {}
for i = 2, #ARGV do out[i - 1] = 0 end
if #ARGV < 2 then return out end
local procs = redis.call('ZRANGEBYSCORE', P .. 'live', '(' .. now, '+inf')
for _, proc in ipairs(procs) do
  local counts = redis.call('HMGET', P .. 'p:' .. proc, unpack(ARGV, 2))
  for i, count in ipairs(counts) do out[i] = out[i] + (tonumber(count) or 0) end
end
return out
