-- The minute slice for a due time, never older than the bucket's cursor: a slice before the
-- cursor is never read again, so a late task goes into the cursor's minute and fires at once.
-- The cursor starts at start_ms's minute in a bucket that has none yet.
local function slice_minute(P, due, start_ms)
  local cursor = tonumber(redis.call('GET', P .. 'cursor'))
  if not cursor then
    cursor = math.floor(start_ms / 60000)
    redis.call('SET', P .. 'cursor', cursor)
  end
  return math.max(math.floor(due / 60000), cursor)
end
