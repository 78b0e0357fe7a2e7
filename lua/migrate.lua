-- lib: record, slices, parking
-- migrate: replace task records of the v1 layout (one hash per task) by their layout-2
-- records, and put each into the layout-2 index of its status. timewheel/store/migrate.py
-- finds the v1 records, builds the new records from them and deletes the v1 indexes after.
--
-- KEYS[1]  bucket prefix "{<prefix>:<bucket>}:"
-- ARGV[1]  now_ms, or "" for Redis's own clock (TIME)
-- ARGV[2..] three values per task: key, the SHA-1 of its v1 hash as read (HGETALL's fields
--          and values joined by NUL), the new record (timewheel/store/layout.py)
--
-- Reply: one MigrateReply per task (timewheel/store/replies.py)
--    1 MIGRATED
--    0 GONE      no v1 record any more (migrated meanwhile)
--   -1 CHANGED   the v1 record changed since it was read (nothing written; read it again)
--
-- A pending task gets a slice of its own (the minute clamped to the layout-2 cursor); a
-- claimed one keeps its v1 lease expiry (its v1 holder cannot complete it any more: the task
-- is sent again when the lease runs out, as after a crash); a parked one goes back to its
-- flow's parked set; a finished one keeps its expiry and joins its finished index.
local P = KEYS[1]
local now = tonumber(ARGV[1])
if not now then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
local out = {}
for i = 2, #ARGV, 3 do
  local key, seen, new = ARGV[i], ARGV[i + 1], ARGV[i + 2]
  local tkey = P .. 't:' .. key
  if redis.call('TYPE', tkey).ok ~= 'hash' then
    out[#out + 1] = 0
  elseif redis.sha1hex(table.concat(redis.call('HGETALL', tkey), '\0')) ~= seen then
    out[#out + 1] = -1
  else
    local old = redis.call('HMGET', tkey, 'minute', 'flow')
    local ttl = redis.call('PTTL', tkey)
    local lease = tonumber(redis.call('ZSCORE', P .. 'lease', key))
    for _, index in ipairs({'lease', 'dead', 'm:' .. tostring(old[1]), 'w:' .. tostring(old[2])}) do
      redis.call('ZREM', P .. index, key)
    end
    local h = unpack_head(new)
    redis.call('DEL', tkey)
    redis.call('SET', tkey, new)
    if PENDING[h[ST]] then
      into_slice(P, key, h[DUE], slice_minute(P, h[DUE], now))
    elseif h[ST] == 'd' then
      redis.call('ZADD', P .. 'ls', lease or now, key)
    elseif h[ST] == 'w' then
      local flow = flow_of(tkey, h)
      redis.call('ZADD', P .. 'pw:' .. flow, h[DUE], key)
      redis.call('ZADD', P .. 'pa', h[DUE], key)
      index_parked_flow(P, flow)
    else
      if h[FINISHED] == 0 then  -- a record that did not convert: failed now
        h[FINISHED] = now
        put_head(tkey, h)
      end
      add_finished(P, h[ST], h[FINISHED], key)
    end
    if ttl > 0 then redis.call('PEXPIRE', tkey, ttl) end
    out[#out + 1] = 1
  end
end
return out
