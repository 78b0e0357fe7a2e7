-- lib: record, slices, claiming, attempts
-- claim: take up to `limit` tasks due at or before horizon_ms, under a lease.
--
-- KEYS[1]  bucket prefix "{<prefix>:<bucket>}:"
-- ARGV[1]  now_ms
-- ARGV[2]  horizon_ms: claim entries with due_ms <= horizon_ms (now + the coming tick + margin)
-- ARGV[3]  limit, most tasks per call (the caller loops while `more` is 1)
-- ARGV[4]  token, unique per call: the claim is recorded under it, so a retried call returns
--          the same tasks instead of claiming others
-- ARGV[5]  lease_margin_ms: lease = max(due, now) + task timeout + margin
-- ARGV[6]  max_minutes, most minute slices read per call (bounds the script after an outage)
-- ARGV[7]  retention_ms: finished-task index entries older than this are dropped
-- ARGV[8]  kept: attempts kept per task (TIMEWHEEL_ATTEMPTS_KEPT); an attempt whose lease ran
--          out after it started goes into the history as lost
--
-- Reply: {more, n, then n times: key, and the record's head, flow and url}
--   more = 1 when the caller should call again (limit reached, a read window came back full,
--   or slices left to read). Keys of layout 1 are not looked at: a process migrates them when
--   it starts (timewheel/store/migrate.py).
--
-- Order: expired leases first (their process died: re-deliver), then the slices from the
-- cursor onwards, found through the minute index `mn`, so empty minutes cost nothing. A slice
-- entry is dropped without claiming when its key is in the minute's delete-set or its record
-- is not pending in this minute (cancelled, replaced, expired). Past slices that drain are
-- deleted with their delete-sets and index entry, and the cursor moves to the oldest minute
-- left. Nothing here reads more entries than it takes, plus those it drops for good.
local P = KEYS[1]
local now, horizon, limit = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local token, margin = ARGV[4], tonumber(ARGV[5])
local budget, retention, kept = tonumber(ARGV[6]), tonumber(ARGV[7]), tonumber(ARGV[8])
local record = P .. 'cl:' .. token
local claim = digest(token)
local out = {0, 0}
local claims = new_claims()

-- A retry of a call whose reply was lost: hand back what it claimed and still holds.
if redis.call('EXISTS', record) == 1 then
  replay_claim(P, record, claim, out)
  out[1] = 1
  return out
end

-- A window that came back full may hide more due entries behind dropped ones: call again.
local more = 0

-- A started attempt whose lease ran out goes into the history as lost. Its lease ran from
-- max(due, its claim's now) (lib/claiming.lua take): when it was to be sent, give or take its
-- process's lateness and a lease margin set otherwise there, so it is kept between a floor
-- and now: its due time, or, when a PATCH has moved it since (the due time is the PATCH's),
-- its previous attempt's time or its creation. A cancelled task is tried no more: its entry
-- takes the record's TTL and has no next attempt. lease: nil when not found (no started_at).
local function lost(key, h, lease)
  local sent = nil
  if lease then
    local floor = h[DUE]
    if h[ST] ~= 'd' then floor = math.max(h[CREATED], h[LAST_AT]) end
    sent = math.max(floor, math.min(now, lease - h[TIMEOUT] - margin))
  end
  local ttl, next_at = nil, math.max(now, h[DUE])
  if h[ST] == 'c' then ttl, next_at = redis.call('PTTL', P .. 't:' .. key), nil end
  add_unanswered(P, key, h[ATT], 'lost',
    'no outcome within its lease: its process died or stalled', kept, ttl, sent, next_at)
end

-- 1. Leases that ran out: their holder died or stalled. Claim them again.
local expired = redis.call('ZRANGEBYSCORE', P .. 'ls', '-inf', now, 'WITHSCORES', 'LIMIT', 0,
  limit)
if #expired == 2 * limit then more = 1 end
for i = 1, #expired, 2 do
  local key, lease = expired[i], tonumber(expired[i + 1])
  local tkey = P .. 't:' .. key
  local h, raw = head_ahead(tkey)
  if h and h[ST] == 'd' then
    if h[STARTED] == 1 then lost(key, h, lease) end
    take(key, tkey, h, raw, now, margin, claim, claims, out)
  else
    if h and h[STARTED] == 1 and (PENDING[h[ST]] or h[ST] == 'c') then
      -- Moved by a PATCH (reschedule.lua) or cancelled (lib/cancelling.lua) while its attempt
      -- was out, which kept its claim and lease for that attempt's answer: none came. The
      -- task stays where the PATCH or the DELETE put it.
      lost(key, h, lease)
      h[CLAIM], h[STARTED] = NONE, 0
      put_head(tkey, h)
    end
    redis.call('ZREM', P .. 'ls', key)
  end
end

-- 2. The slices, oldest first.
local cursor = cursor_of(P)
if cursor then
  local now_minute = math.floor(now / 60000)
  local minutes = redis.call('ZRANGEBYSCORE', P .. 'mn', cursor, math.floor(horizon / 60000),
    'LIMIT', 0, budget + 1)
  if #minutes > budget then more = 1 end
  for i = 1, math.min(#minutes, budget) do
    if out[2] >= limit then break end
    local m = tonumber(minutes[i])
    local zkey, dkey = P .. 'ms:' .. m, P .. 'md:' .. m
    local window = limit - out[2]
    local entries = redis.call('ZRANGEBYSCORE', zkey, '-inf', horizon, 'LIMIT', 0, window)
    if #entries == window then more = 1 end
    -- Most minutes have no delete-set (nothing cancelled or moved out): then no entry is in
    -- it, and one EXISTS saves a SISMEMBER per entry.
    local deletes = #entries > 0 and redis.call('EXISTS', dkey) == 1
    for _, key in ipairs(entries) do
      local tkey = P .. 't:' .. key
      local h, raw = head_ahead(tkey)
      if not (deletes and redis.call('SISMEMBER', dkey, key) == 1) and h and PENDING[h[ST]]
        and pending_minute(h[DUE], cursor) == m then
        if h[STARTED] == 1 then
          -- Moved by a PATCH while its attempt was out (reschedule.lua made it due when that
          -- lease ends), and no answer came: taken now, that attempt is lost (step 1 would
          -- have found it so, had no claim come first).
          lost(key, h, tonumber(redis.call('ZSCORE', P .. 'ls', key)))
        end
        take(key, tkey, h, raw, now, margin, claim, claims, out)
      end
    end
    -- Every entry read leaves the slice, taken or dropped: they are its lowest ranks.
    if #entries > 0 then redis.call('ZREMRANGEBYRANK', zkey, 0, #entries - 1) end
    -- Only a past minute can be complete: nothing new is ever placed before the cursor.
    if m < now_minute and redis.call('EXISTS', zkey) == 0 then
      redis.call('DEL', dkey)
      redis.call('ZREM', P .. 'mn', m)
    end
  end
  if out[2] >= limit then more = 1 end
  -- The oldest minute that may still hold entries, but never past now's minute (later
  -- tasks must still find the cursor at or before their own minute).
  local first = redis.call('ZRANGEBYSCORE', P .. 'mn', cursor, '+inf', 'LIMIT', 0, 1)[1]
  redis.call('SET', P .. 'cur', math.max(cursor, math.min(tonumber(first) or now_minute,
    now_minute)))
end

write_claims(P, record, claims)
-- Finished-task indexes: entries older than the retention go with their records, at most
-- 1000 per index and call so that a long outage does not make one call long. `fc` is the
-- cancelled index from before its pages (lua/lib/record.lua): once only its keeper is left,
-- it goes.
for _, name in ipairs({'fs', 'ff', 'fc'}) do
  local old = redis.call('ZCOUNT', P .. name, '-inf', now - retention)
  if old > 0 then
    redis.call('ZREMRANGEBYRANK', P .. name, 0, math.min(old, 1000) - 1)
    if name == 'fc' and redis.call('ZCOUNT', P .. name, '-inf', BELOW_KEEPER) == 0 then
      redis.call('DEL', P .. name)
    end
  end
end
trim_paged(P, 'fc', now - retention)
out[1] = more
return out
