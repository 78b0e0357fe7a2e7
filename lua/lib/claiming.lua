-- Claim replies (claim.lua, unpark.lua): {more, n, then n times: key, and the record's head,
-- flow and url}.

local function emit(out, key, tkey, h)
  out[#out + 1] = key
  out[#out + 1] = prefix_of(tkey, h)
  out[2] = out[2] + 1
end

-- Lease a task to the call's token until max(due, now) + its timeout + margin, and note it in
-- the call's record list (so a re-sent call returns the same tasks).
local function take(P, key, tkey, h, now, margin, claim, record, out)
  redis.call('ZADD', P .. 'ls', math.max(h[DUE], now) + h[TIMEOUT] + margin, key)
  h[ST], h[CLAIM], h[STARTED] = 'd', claim, 0
  put_head(tkey, h)
  redis.call('RPUSH', record, key)
  emit(out, key, tkey, h)
end

-- A call re-sent after its reply was lost: hand back what it took and still holds.
local function replay_claim(P, record, claim, out)
  for _, key in ipairs(redis.call('LRANGE', record, 0, -1)) do
    local tkey = P .. 't:' .. key
    local h = head(tkey)
    if h and h[ST] == 'd' and h[CLAIM] == claim then emit(out, key, tkey, h) end
  end
end
