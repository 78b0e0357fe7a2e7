-- The attempt history of a task (GET /tasks/{key}/attempts): the list P .. 'a:' .. key, one
-- JSON object per attempt, oldest first, at most `kept` long. A task that was never tried has
-- none (the history costs a pending task nothing), and the list takes the record's TTL when
-- the task finishes, so it expires with the task. Entries use short names (timewheel/store/attempts.py reads them):
--   n attempt number, s started_at ms, d duration ms, o outcome (delivered, retry, failed,
--   lost, cancelled), c status code, e error, h response headers {name: value}, b response
--   body excerpt, bt 1 when the body was cut, na next_attempt_at ms, p process "host:pid".
-- Absent fields are null in the view.

local function attempts_key(P, key) return P .. 'a:' .. key end

-- Append one entry (a JSON text), keeping the newest `kept` (0 keeps none). `ttl`: the
-- record's TTL when the task has just finished (the list expires with it), nil while it is
-- pending (a pending task's list has none: replay and a re-create persist it).
local function add_attempt(P, key, entry, kept, ttl)
  if kept <= 0 then return end
  local akey = attempts_key(P, key)
  if redis.call('RPUSH', akey, entry) > kept then redis.call('LTRIM', akey, -kept, -1) end
  -- A PTTL a caller passed may be -1 (no TTL), and PEXPIRE with it would delete the list.
  if ttl and ttl > 0 then redis.call('PEXPIRE', akey, ttl) end
end

-- An attempt that no answer will ever be recorded for: its lease ran out (its process died
-- or stalled), or a DELETE stopped it before it was sent. A lost one has `started`, when it
-- was to be sent (lua/claim.lua reads it off its lease), and `next_at`, when it is tried
-- again (the claim that found it takes it then).
local function add_unanswered(P, key, n, outcome, err, kept, ttl, started, next_at)
  add_attempt(P, key, cjson.encode({n = n, o = outcome, e = err, s = started, na = next_at}),
    kept, ttl)
end

-- An entry the executor wrote before the answer met a DELETE or a PATCH (lua/complete.lua),
-- with the outcome and next attempt that hold now (next_at nil: none). Rare: decoded only here.
-- cjson writes numbers with 14 significant digits: a next_at of 15 (past year 5138) would come
-- back rounded and as a float, so it is written whole after the rest (the other numbers are
-- the executor's: attempt, start, duration, status, 13 digits at most).
local function amend_entry(entry, outcome, next_at)
  local fields = cjson.decode(entry)
  fields.o, fields.na = outcome, nil
  local text = cjson.encode(fields)
  if next_at == nil then return text end
  return string.sub(text, 1, -2) .. string.format(',"na":%d}', next_at)
end

-- A started attempt its holder gives up unsent (release, park) after a DELETE kept its claim
-- and lease for its answer (lib/cancelling.lua): they go, and its history says the DELETE
-- stopped it before it was sent.
local function cancelled_unsent(P, key, tkey, h, kept)
  redis.call('ZREM', P .. 'ls', key)
  h[CLAIM], h[STARTED] = NONE, 0
  put_head(tkey, h)
  add_unanswered(P, key, h[ATT], 'cancelled', 'stopped by a DELETE before it was sent',
    kept, redis.call('PTTL', tkey))
end

-- A finished task becomes pending again (replay, or a re-create over its record): its
-- history no longer expires.
local function keep_attempts(P, key) redis.call('PERSIST', attempts_key(P, key)) end
