-- start: mark attempts as begun, just before they are sent. Only a caller that still holds
-- the claim may start: a task cancelled or replaced after it was claimed is not sent.
--
-- KEYS[1]  bucket prefix "{<prefix>:<bucket>}:"
-- ARGV[1]  now_ms
-- ARGV[2..] key, token pairs
--
-- Reply: one number per pair: the attempt number (1, 2, ...), or 0 when the claim is not the
--        caller's any more (do not send). Idempotent: starting a started attempt again (a
--        retried call) returns the same number.
local P = KEYS[1]
local now = tonumber(ARGV[1])
local out = {}
for i = 2, #ARGV, 2 do
  local tkey = P .. 't:' .. ARGV[i]
  local st = redis.call('HMGET', tkey, 'claim', 'status', 'attempts', 'started')
  if st[1] == ARGV[i + 1] and st[2] == 'delivering' and st[4] then
    out[#out + 1] = tonumber(st[3])
  elseif st[1] == ARGV[i + 1] and st[2] == 'delivering' then
    local attempt = tonumber(st[3]) + 1
    redis.call('HSET', tkey, 'attempts', attempt, 'started', now)
    out[#out + 1] = attempt
  else
    out[#out + 1] = 0
  end
end
return out
