-- sched_drop: forget outstanding occurrences (their task finished, or was cancelled).
--
-- KEYS[1]  bucket prefix "{<prefix>:<bucket>}:" (keys as in sched_put.lua)
-- ARGV[1..] members "<id> <occ ms>"
--
-- Reply: how many were outstanding
local P = KEYS[1]
local n = 0
for _, member in ipairs(ARGV) do
  n = n + redis.call('ZREM', P .. 'socc', member)
  redis.call('ZREM', P .. 'soccl', member)
end
return n
