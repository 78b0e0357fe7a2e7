-- lib: record, claiming, parking
-- unpark: claim the earliest parked tasks of one flow (lua/park.lua) once permits are free.
--
-- KEYS[1]  bucket prefix "{<prefix>:<bucket>}:"
-- ARGV[1]  now_ms
-- ARGV[2]  flow key
-- ARGV[3]  limit, most tasks to take (the permits the caller holds for them)
-- ARGV[4]  token, unique per call (as in lua/claim.lua: a re-sent call returns the same tasks)
-- ARGV[5]  lease_margin_ms: lease = max(due, now) + task timeout + margin
--
-- Reply: as lua/claim.lua: {more, n, then n times: key and the record's head, flow, url};
--        more = 1 when the flow has more parked tasks in this bucket.
local P = KEYS[1]
local now, flow, limit = tonumber(ARGV[1]), ARGV[2], tonumber(ARGV[3])
local token, margin = ARGV[4], tonumber(ARGV[5])
local record, wkey = P .. 'cl:' .. token, P .. 'pw:' .. flow
local claim = digest(token)
local out = {0, 0}
local claims = new_claims()

if redis.call('EXISTS', record) == 1 then
  replay_claim(P, record, claim, out)
  return out
end

local entries = redis.call('ZRANGE', wkey, 0, limit - 1)
for _, key in ipairs(entries) do
  local tkey = P .. 't:' .. key
  local h, raw = head_ahead(tkey)
  redis.call('ZREM', wkey, key)
  -- Cancel and replace take a parked task out of pw:<flow> themselves; an entry left behind
  -- by an expired record is dropped here.
  if h and h[ST] == 'w' then
    redis.call('ZREM', P .. 'pa', key)
    take(key, tkey, h, raw, now, margin, claim, claims, out)
  end
end

if index_parked_flow(P, flow) then out[1] = 1 end
write_claims(P, record, claims)
return out
