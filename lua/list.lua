-- lib: record, slices, matching
-- list: one bucket's share of a page of GET /tasks: the next tasks of one status in one index,
-- in the index's order, after a position. Read-only, and bounded: at most `budget` index
-- entries (and minute slices) are looked at, however many are skipped.
--
-- KEYS[1]  bucket prefix "{<prefix>:<bucket>}:"
-- ARGV[1]  index: "slices" (the minute slices, through mn, in due order), "pages:fc" (the
--          cancelled index's pages, lua/lib/record.lua) or a zset of the bucket: "pa"
--          (parked), "ls" (leases), "fs" / "ff" / "fc" (finished; "fc" from before pages)
-- ARGV[2]  order: "asc" or "desc" (by score, ties by key, as Redis orders a zset)
-- ARGV[3]  status letters the record may have (timewheel/store/layout.py), e.g. "s" or "sr"
-- ARGV[4]  attempts: "" any, "0" none yet, "+" at least one (parked tasks: scheduled or
--          retrying)
-- ARGV[5]  key prefix ("" for any)
-- ARGV[6]  position to resume after: score ("" to start at the beginning)
-- ARGV[7]  position to resume after: key
-- ARGV[8]  limit, most tasks to return
-- ARGV[9]  budget, most index entries and slices to look at
-- ARGV[10] flow key ("" or absent for any)
-- ARGV[11] due before, ms ("" or absent for any)
-- ARGV[12] created before, ms ("" or absent for any); ARGV[3..5, 10..12] are the filter of
--          lua/lib/matching.lua (bulk jobs use the last three)
-- ARGV[13] since, ms ("" or absent for none; a cancel job's start): the slices' walk also
--          finds a task cancelled at or after it that passes the filter but for its status, in
--          its own slice (its entry waits there for the claimer): the job's step finds it
--          finished and counts it as skipped, as the contract says ("finished meanwhile")
-- ARGV[14] the job's id, with ARGV[13]: a task the job cancelled itself is not taken again (a
--          task it found and cancelled in one minute may wait in a later one's slice, moved by
--          a PATCH or a retry between the job's listing and its step: counted there already)
--
-- Reply: {done, score, key, then score, key of each task found}. done = 1 when the index
-- was read to its end; score, key = the position of the last entry looked at ("" if none):
-- every task of the listing up to there is in the reply, so the next call resumes after it.
-- A slice entry counts only if its record is pending in that minute (entries of cancelled
-- or moved tasks wait there for the claimer).
local P = KEYS[1]
local index, desc = ARGV[1], ARGV[2] == 'desc'
local filter = {want = ARGV[3], rule = ARGV[4], prefix = ARGV[5], flow = ARGV[10] or '',
                due_before = tonumber(ARGV[11] or ''), created_before = tonumber(ARGV[12] or '')}
local since = tonumber(ARGV[13] or '')
local by_job = since and digest('job:' .. (ARGV[14] or ''))  -- lua/job_step.lua's op
-- A cancelled record keeps its attempts: none was scheduled, some was retrying.
local was = {s = '0', r = '+', sr = ''}
local cancelled = {want = 'c', rule = was[filter.want] or filter.rule, prefix = filter.prefix,
                   flow = filter.flow, due_before = filter.due_before,
                   created_before = filter.created_before}
local after, after_key = tonumber(ARGV[6]), ARGV[7]
local limit, budget = tonumber(ARGV[8]), tonumber(ARGV[9])
local found, seen = {}, 0
local reached, reached_key = '', ''
local RANGE = desc and 'ZREVRANGE' or 'ZRANGE'
-- A cancelled index's entry counts only at its record's finish time. A key created again after
-- its record expired, and cancelled again before the retention trim, has a stale entry on
-- another page than its new one (lua/lib/record.lua add_paged cannot know where), or in the
-- zset from before pages; the record's time says which is its own.
local exact = index == 'fc' or index == 'pages:fc'
local cursor = cursor_of(P)

-- Byte order, as Redis orders members (Lua's < follows the locale).
local function lt(a, b)
  for i = 1, math.min(#a, #b) do
    local x, y = string.byte(a, i), string.byte(b, i)
    if x ~= y then return x < y end
  end
  return #a < #b
end

local function wanted(key, minute)
  if matching(P, key, filter, minute, cursor) then return true end
  if not (since and minute) or string.sub(key, 1, #filter.prefix) ~= filter.prefix then
    return false
  end
  local h = head(P .. 't:' .. key)  -- cancelled since the job began, in its own slice
  return h ~= nil and h[ST] == 'c' and h[FINISHED] >= since and h[OP] ~= by_job
    and passes(P, key, cancelled, h, minute, cursor)
end

-- The rank (in the listing's order) of the first entry after the position.
local function resume_rank(zkey)
  if not after then return 0 end
  local rank
  if desc then rank = redis.call('ZREVRANK', zkey, after_key)
  else rank = redis.call('ZRANK', zkey, after_key) end
  if rank and tonumber(redis.call('ZSCORE', zkey, after_key)) == after then return rank + 1 end
  -- The position's own entry is gone: bisect the entries tied on its score by key.
  local lo, hi
  if desc then
    lo = redis.call('ZCOUNT', zkey, '(' .. after, '+inf')
    hi = redis.call('ZCOUNT', zkey, after, '+inf')
  else
    lo = redis.call('ZCOUNT', zkey, '-inf', '(' .. after)
    hi = redis.call('ZCOUNT', zkey, '-inf', after)
  end
  while lo < hi do
    local mid = math.floor((lo + hi) / 2)
    local member = redis.call(RANGE, zkey, mid, mid)[1]
    if (desc and lt(member, after_key)) or (not desc and lt(after_key, member)) then
      hi = mid
    else
      lo = mid + 1
    end
  end
  return lo
end

-- Read one zset from the position on; true when it ran out of entries. A slice after the
-- position's minute holds only later due times, so it is read from its start, except the
-- oldest slice (the cursor's), where late tasks keep earlier due times; so is a page after
-- the position's page (from_start).
local function walk(zkey, minute, from_start)
  local rank = 0
  local resumes = not minute or minute == cursor or minute == math.floor((after or 0) / 60000)
  if resumes and not from_start then
    rank = resume_rank(zkey)
  end
  while true do
    -- Never stop before one entry was looked at: the next call must get further.
    local window = math.min(budget - seen, 100)
    if #found >= 2 * limit or (window <= 0 and reached ~= '') then return false end
    window = math.max(window, 1)
    local rows = redis.call(RANGE, zkey, rank, rank + window - 1, 'WITHSCORES')
    for i = 1, #rows, 2 do
      local key, score = rows[i], tonumber(rows[i + 1])
      seen = seen + 1
      reached, reached_key = score, key
      if wanted(key, minute) and (not exact or head(P .. 't:' .. key)[FINISHED] == score) then
        found[#found + 1] = score
        found[#found + 1] = key
        if #found >= 2 * limit then return false end
      end
    end
    if #rows < 2 * window then return true end
    rank = rank + window
  end
end

local done = true
if index == 'slices' then
  -- Minutes in order: every slice but the oldest holds only its own minute's due times (a
  -- late task is put into the cursor's minute, the oldest slice), so this is due order.
  local from = after and math.floor(after / 60000) or '-inf'
  while done do
    local minutes = redis.call('ZRANGEBYSCORE', P .. 'mn', from, '+inf', 'LIMIT', 0, 50)
    for _, m in ipairs(minutes) do
      if (seen >= budget and reached ~= '') or #found >= 2 * limit then done = false; break end
      seen = seen + 1
      if not walk(P .. 'ms:' .. m, tonumber(m)) then done = false; break end
      from = '(' .. m
    end
    if #minutes < 50 then break end
  end
elseif string.sub(index, 1, 6) == 'pages:' then
  -- A paged index (lua/lib/record.lua): its pages in order, each holding the times from its
  -- start up to the next page's, so this is the index's order. The first page read is the
  -- position's (the last to start by it); later ones are read from their start.
  local name = string.sub(index, 7)
  local dir = P .. name .. 'p'
  local bound, from_start = desc and '+inf' or '-inf', not after
  if after then bound = desc and after or (page_start(P, name, after) or '-inf') end
  while done do
    local starts
    if desc then starts = redis.call('ZREVRANGEBYSCORE', dir, bound, '-inf', 'LIMIT', 0, 50)
    else starts = redis.call('ZRANGEBYSCORE', dir, bound, '+inf', 'LIMIT', 0, 50) end
    for _, start in ipairs(starts) do
      if (seen >= budget and reached ~= '') or #found >= 2 * limit then done = false; break end
      seen = seen + 1
      if not walk(P .. name .. ':' .. start, nil, from_start) then done = false; break end
      from_start, bound = true, '(' .. start
    end
    if #starts < 50 then break end
  end
else
  done = walk(P .. index, nil)
end

local out = {done and 1 or 0, reached, reached_key}
for i = 1, #found do out[#out + 1] = found[i] end
return out
