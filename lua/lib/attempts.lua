-- The attempt history of a task (GET /tasks/{key}/attempts): the list P .. 'a:' .. key, one
-- JSON object per attempt, oldest first, at most `kept` long. A task that was never tried has
-- none (the history costs a pending task nothing), and the list takes the record's TTL, so it
-- expires with the task. Entries use short names (timewheel/store/attempts.py reads them):
--   n attempt number, s started_at ms, d duration ms, o outcome (delivered, retry, failed,
--   lost, cancelled), c status code, e error, h response headers {name: value}, b response
--   body excerpt, bt 1 when the body was cut, na next_attempt_at ms, p process "host:pid".
-- Absent fields are null in the view.

local function attempts_key(P, key) return P .. 'a:' .. key end

-- Append one entry (a JSON text) and trim the list to the newest `kept`; 0 keeps none.
local function add_attempt(P, key, tkey, entry, kept)
  if kept <= 0 then return end
  local akey = attempts_key(P, key)
  redis.call('RPUSH', akey, entry)
  redis.call('LTRIM', akey, -kept, -1)
  local ttl = redis.call('PTTL', tkey)
  if ttl > 0 then redis.call('PEXPIRE', akey, ttl) else redis.call('PERSIST', akey) end
end

-- An attempt that no answer will ever be recorded for: its lease ran out (its process died
-- or stalled), or a DELETE stopped it before it was sent.
local function add_unanswered(P, key, tkey, n, outcome, err, kept)
  add_attempt(P, key, tkey, cjson.encode({n = n, o = outcome, e = err}), kept)
end
