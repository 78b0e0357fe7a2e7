-- sched_checks: outstanding occurrences to look at now, with their schedule's state (read only).
-- An occurrence is looked at when its creator's lease ran out (was its task created?), and
-- after it was due (has its task finished, so it can be forgotten?).
--
-- KEYS[1]  bucket prefix "{<prefix>:<bucket>}:" (keys as in sched_put.lua)
-- ARGV[1]  now_ms
-- ARGV[2]  limit, most occurrences per call
--
-- Reply: {n, then n times: member "<id> <occ ms>", state}
--   state  "active", "paused", or "gone" (deleted or expired: cancel the occurrence)
local P = KEYS[1]
local members = redis.call('ZRANGEBYSCORE', P .. 'socc', '-inf', ARGV[1], 'LIMIT', 0, ARGV[2])
local out = {#members}
for _, m in ipairs(members) do
  local id = string.sub(m, 1, string.find(m, ' ', 1, true) - 1)
  local st = redis.call('HMGET', P .. 's:' .. id, 'state', 'paused')
  local state = 'active'
  if not st[2] or st[1] == 'deleted' then state = 'gone'
  elseif st[2] == '1' then state = 'paused' end
  out[#out + 1] = m
  out[#out + 1] = state
end
return out
