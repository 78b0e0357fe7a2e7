-- The minute slice for a due time, never older than the bucket's cursor: a slice before the
-- cursor is never read again, so a late task goes into the cursor's minute and fires at once.
-- The cursor starts at start_ms's minute in a bucket that has none yet.
local function slice_minute(P, due, start_ms)
  local cursor = tonumber(redis.call('GET', P .. 'cur'))
  if not cursor then
    cursor = math.floor(start_ms / 60000)
    redis.call('SET', P .. 'cur', cursor)
  end
  return math.max(math.floor(due / 60000), cursor)
end

-- Put a task's entry into a minute slice: out of the minute's delete-set (it may have left
-- this minute before) and the minute into the index of minutes that have a slice (mn), which
-- lets claim and listing skip empty minutes.
local function into_slice(P, key, due, minute)
  redis.call('ZADD', P .. 'ms:' .. minute, due, key)
  redis.call('SREM', P .. 'md:' .. minute, key)
  redis.call('ZADD', P .. 'mn', minute, minute)
end

local function cursor_of(P) return tonumber(redis.call('GET', P .. 'cur')) end

-- The slice that holds a pending task's entry: its due minute, or the cursor's if that is
-- later (slice_minute put it there, and the cursor never passes a slice with entries left).
local function pending_minute(due, cursor)
  return math.max(math.floor(due / 60000), cursor or 0)
end
