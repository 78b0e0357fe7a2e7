-- lib: memory
-- sched_put: create or replace a recurring schedule (PUT /schedules/{id}).
--
-- KEYS[1]  bucket prefix "{<prefix>:<bucket>}:" of the schedule (crc32(id) % buckets). Keys:
--          P s:<id> record hash, P sdue zset id -> next ms, P sids zset (lex) of ids,
--          P socc zset "<id> <occ ms>" -> check-at ms, P soccl zset (lex) of the same members.
-- ARGV[1]  schedule id
-- ARGV[2]  expected version: the "ver" the caller read ("" when it read no live record);
--          a different one means a concurrent change: the caller reads again and retries
-- ARGV[3]  spec, JSON {cron, every, timezone, task}
-- ARGV[4]  paused: "1" or "0"
-- ARGV[5]  next occurrence ms, computed by the caller after max(now, hi); "" for none
-- ARGV[6]  now_ms
-- ARGV[7]  request id, unique per API call: kept in the record ("op"), so the same call re-sent
--          by redis-py after a lost reply answers as the first did instead of "stale"
--
-- Reply: {code, occ...}; code is a SchedPutReply (timewheel/store/replies.py)
--    0 CREATED
--    1 REPLACED
--   -3 STALE     version changed; nothing written
--   occ   outstanding occurrences (ms) the caller must cancel: every one when the schedule is
--         now paused, or when the record it replaces was a deleted one
local P, id = KEYS[1], ARGV[1]
local rkey = P .. 's:' .. id
local old = redis.call('HMGET', rkey, 'ver', 'state', 'created', 'hi', 'op', 'opc')
local live = old[1] and old[2] ~= 'deleted'

local function outstanding(out)
  local members = redis.call('ZRANGEBYLEX', P .. 'soccl', '[' .. id .. ' ', '(' .. id .. '!')
  for _, m in ipairs(members) do out[#out + 1] = tonumber(string.sub(m, #id + 2)) end
  return out
end

if old[5] == ARGV[7] then  -- this very call, re-sent
  if ARGV[4] == '1' then return outstanding({tonumber(old[6])}) end
  return {tonumber(old[6])}
end
local current = ''
if live then current = old[1] end
if current ~= ARGV[2] then return {-3} end

local code = live and 1 or 0
local out = {code}
if ARGV[4] == '1' or (old[1] and not live) then outstanding(out) end

-- All checks are done; writes follow. The version is never below now_ms: a schedule deleted,
-- expired and created again must not repeat a version that a process may still have cached
-- with the old spec.
local ver = math.max((tonumber(old[1]) or 0) + 1, tonumber(ARGV[6]))
local created = ARGV[6]
if live then created = old[3] end
refuse_when_full(P)
redis.call('DEL', rkey)
redis.call('HSET', rkey, 'spec', ARGV[3], 'paused', ARGV[4], 'ver', ver, 'created', created,
  'op', ARGV[7], 'opc', code)
-- hi (the latest occurrence ever reserved) survives a replace and a delete: occurrence keys
-- at or before it may exist (or be tombstoned), so they are never reserved again.
if old[4] then redis.call('HSET', rkey, 'hi', old[4]) end
if ARGV[4] == '0' and ARGV[5] ~= '' then
  redis.call('HSET', rkey, 'next', ARGV[5])
  redis.call('ZADD', P .. 'sdue', ARGV[5], id)
else
  redis.call('ZREM', P .. 'sdue', id)
end
redis.call('ZADD', P .. 'sids', 0, id)
return out
