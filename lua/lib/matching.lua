-- The task filter of a listing (lua/list.lua) and of a bulk job's step (lua/job_step.lua).
--
-- A filter is six ARGV values from position i on:
--   i      status letters the record may have (timewheel/store/layout.py), e.g. "s" or "sr"
--   i + 1  attempts: "" any, "0" none yet, "+" at least one
--   i + 2  key prefix ("" for any)
--   i + 3  flow key ("" for any)
--   i + 4  due before, ms: the task's due time (its next attempt's; its last one's once
--          finished) is earlier ("" for any)
--   i + 5  created before, ms ("" for any)
-- Missing values (a caller that predates the last three) mean "any".
local function filter_at(argv, i)
  return {want = argv[i], rule = argv[i + 1] or '', prefix = argv[i + 2] or '',
          flow = argv[i + 3] or '', due_before = tonumber(argv[i + 4] or ''),
          created_before = tonumber(argv[i + 5] or '')}
end

-- Whether a task whose head (or its first fields, lib/record.lua `state`) is h passes the
-- filter. minute: the slice the entry was found in (nil for other indexes): an entry counts
-- only if its record is pending in that minute (entries of cancelled or moved tasks wait in
-- a slice for the claimer).
local function passes(P, key, f, h, minute, cursor)
  if not h or string.sub(key, 1, #f.prefix) ~= f.prefix then return false end
  if not string.find(f.want, h[ST], 1, true) then return false end
  if minute and pending_minute(h[DUE], cursor) ~= minute then return false end
  if f.rule == '0' and h[ATT] ~= 0 then return false end
  if f.rule == '+' and h[ATT] == 0 then return false end
  if f.due_before and h[DUE] >= f.due_before then return false end
  if f.created_before and h[CREATED] >= f.created_before then return false end
  return f.flow == '' or flow_of(P .. 't:' .. key, h) == f.flow
end

-- Whether the task passes the filter, reading only the head's first fields unless the filter
-- needs the flow or the created time; a record of the v1 layout never passes.
local function matching(P, key, f, minute, cursor)
  if string.sub(key, 1, #f.prefix) ~= f.prefix then return false end
  local tkey = P .. 't:' .. key
  local h
  if f.flow ~= '' or f.created_before then h = head(tkey) else h = state(tkey) end
  return passes(P, key, f, h, minute, cursor)
end
