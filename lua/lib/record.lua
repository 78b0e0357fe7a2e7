-- The task record, layout 2 (timewheel/store/layout.py has the field list and why):
--   head (fixed, HEAD bytes) | flow | url | headers | body | last_err
-- A script reads the head with one GETRANGE and writes it back in place with SETRANGE, so
-- state changes never copy the request.
local HEAD_FMT = '>Bc1HBc1BI6I6I6I4I4I6HI6c6c6Bc12BHI4I4H'
local HEAD = struct.size(HEAD_FMT)
local NFIELDS = 23
-- Positions in a head table.
local ST, ATT, MAX, STARTED, DUE, EXEC = 2, 3, 4, 6, 7, 8
local CREATED, TIMEOUT, LAST_AT, LAST_CODE, FINISHED = 9, 11, 12, 13, 14
local CLAIM, OP, OPR, FP, FL, UL, HL, BL, EL = 15, 16, 17, 18, 19, 20, 21, 22, 23
local NONE = string.rep('\0', 6)
local PENDING = {s = true, r = true}
local FINISHED_INDEX = {o = 'fs', f = 'ff', c = 'fc'}

-- The lease index `ls`, the finished indexes `fs`, `ff` (and `fc` from before its pages, below) and
-- a flow's `held` permits are kept skiplists whatever their size. Redis keeps a zset of up to
-- zset-max-listpack-entries members (512 here, store/redis_settings.py, for the slices' sake) as
-- one listpack, where each insert scans it and moves its tail: at 4,000 callbacks/s a few hundred
-- leases cost 8 us of Redis CPU a callback, a finished index under 512 entries a bucket (any
-- wheel's first hours, or a quiet one) ~6 us more, and a flow's held permits (lua/permits.lua) ~1.5
-- us (bench/README.md). A member longer than the compact limit (zset-max-listpack-value, 64 bytes)
-- makes it a skiplist, and while this member stays the key is never emptied (so never deleted, and
-- never made a listpack again). Its score is past any time, so no lease range or retention trim
-- reaches it; it is no task key or permit id ('#' is outside KEY_PATTERN and permit ids are hex),
-- so listings and bulk jobs, which read each member's record, pass over it, and counts stop below
-- its score. Its text names the index it was first used for. store/keys.py spells it the same.
local INDEX_KEEPER = '#keeps-the-lease-index-a-skiplist#' .. string.rep('#', 222)
local INDEX_KEEPER_SCORE = 9007199254740991  -- 2^53 - 1: past any time, exact as a Lua number
-- A range bound just below it, as text: Lua's own number to text would round it (to 15 digits).
local BELOW_KEEPER = '(9007199254740991'

-- The cancelled index is paged: zsets `fc:<start>` of about PAGE_CAP tasks each, listed in the
-- directory `fcp` (member and score: each page's start, ms). A page holds the finished times from
-- its start up to the next page's start, so a time belongs to one page, and reading the pages in
-- order reads the index in order (lua/list.lua). A page of up to 128 entries stays a listpack on
-- any Redis (the default zset-max-listpack-entries): ~35 bytes a cancelled task where one skiplist
-- costs ~109 (bench/README.md), and trimming drops whole pages. Cancels are not on the callbacks'
-- path, so the listpack's insert cost does not matter here as it does for fs, ff and ls. A
-- wheel written before pages keeps its `fc` zset until retention empties it: it is still listed,
-- trimmed and removed from (store/listing.py).
local PAGED = {fc = true}
local PAGE_CAP = 128

-- The start of the page of index `name` that holds time `at` ms; nil when no page starts by then.
local function page_start(P, name, at)
  return redis.call('ZREVRANGEBYSCORE', P .. name .. 'p', at, '-inf', 'LIMIT', 0, 1)[1]
end

local function add_paged(P, name, at, key)
  local dir = P .. name .. 'p'
  local start = page_start(P, name, at)
  if not start then  -- earlier than every page: a page of its own
    start = string.format('%d', at)
    redis.call('ZADD', dir, at, start)
  elseif tonumber(start) < at and redis.call('ZCARD', P .. name .. ':' .. start) >= PAGE_CAP then
    -- A full page ends at `at`: a new page from there on takes `at` and the old page's entries
    -- from `at` on (none when times come in order; some when a writer's clock is behind, or a
    -- migration adds old times). So a page holds more than PAGE_CAP entries only when more
    -- than that share its first millisecond (or one more, after a move).
    local old_start = start
    local old = P .. name .. ':' .. old_start
    local moved = redis.call('ZRANGEBYSCORE', old, at, '+inf', 'WITHSCORES')
    start = string.format('%d', at)
    redis.call('ZADD', dir, at, start)
    if #moved > 0 then
      local scored = {}
      for i = 1, #moved, 2 do
        scored[#scored + 1] = moved[i + 1]
        scored[#scored + 1] = moved[i]
      end
      redis.call('ZADD', P .. name .. ':' .. start, unpack(scored))
      redis.call('ZREMRANGEBYSCORE', old, at, '+inf')
      if redis.call('EXISTS', old) == 0 then redis.call('ZREM', dir, old_start) end
    end
  end
  redis.call('ZADD', P .. name .. ':' .. start, at, key)
end

-- Its page's range goes to the page before it when a page empties (its times are all later).
local function remove_paged(P, name, at, key)
  local start = page_start(P, name, at)
  if not start then return end
  local page = P .. name .. ':' .. start
  if redis.call('ZREM', page, key) == 1 and redis.call('EXISTS', page) == 0 then
    redis.call('ZREM', P .. name .. 'p', start)
  end
end

-- Entries of paged index `name` at or before `upto` ms go, oldest first: whole pages (at most
-- eight pages a call, so a long outage does not make one call long), the last maybe in part.
local function trim_paged(P, name, upto)
  local starts = redis.call('ZRANGEBYSCORE', P .. name .. 'p', '-inf', upto, 'LIMIT', 0, 8)
  for i, start in ipairs(starts) do
    local page = P .. name .. ':' .. start
    -- Every page but the last found: the next one starts by `upto`, so all of it is older.
    if i == #starts and redis.call('ZREMRANGEBYSCORE', page, '-inf', upto) == 0 then return end
    if i < #starts or redis.call('EXISTS', page) == 0 then
      redis.call('DEL', page)
      redis.call('ZREM', P .. name .. 'p', start)
    end
  end
end

-- A finished task into its status's index (fs, ff, fc), at `at` ms, with the keeper in the
-- same ZADD (its score never changes: re-adding it costs no second Redis call).
local function add_finished(P, st, at, key)
  local name = FINISHED_INDEX[st]
  if PAGED[name] then return add_paged(P, name, at, key) end
  redis.call('ZADD', P .. name, at, key, INDEX_KEEPER_SCORE, INDEX_KEEPER)
end

-- A task finished at `at` ms (its record's FINISHED) out of its status's index: a paged index's
-- page and its zset from before pages both.
local function remove_finished(P, st, at, key)
  local name = FINISHED_INDEX[st]
  if PAGED[name] then remove_paged(P, name, at, key) end
  redis.call('ZREM', P .. name, key)
end

-- The 6 bytes kept for a claim token or request id: a SHA-1 prefix (layout.digest). Its 12 hex
-- digits are a 48-bit integer, exact in a Lua number, packed as the head packs its times: a
-- gsub with a function per byte took 3 us of Redis CPU a call, this 1 (schedule, start and
-- complete run it once per task).
local function digest(text)
  return struct.pack('>I6', tonumber(string.sub(redis.sha1hex(text), 1, 12), 16))
end

local function unpack_head(raw)
  local h = {struct.unpack(HEAD_FMT, raw)}
  h[NFIELDS + 1] = nil  -- struct.unpack returns the next position last
  return h
end

-- The head of a task's record as a table; nil when there is none. A key of another type (a
-- record of the v1 layout, see timewheel/store/migrate.py) is no record either; the second
-- value says so, for the scripts that must refuse rather than overlook it.
local function head(tkey)
  local raw = redis.pcall('GETRANGE', tkey, 0, HEAD - 1)
  if type(raw) ~= 'string' then return nil, true end
  if #raw < HEAD then return nil, false end
  return unpack_head(raw), false
end

-- The head's first fields only (ver, st, att, max, meth, started, due, at the same positions
-- as in a full head): enough to tell whether a task belongs to a listing, at a third the cost.
local STATE_FMT = '>Bc1HBc1BI6'
local STATE = struct.size(STATE_FMT)
local function state(tkey)
  local raw = redis.pcall('GETRANGE', tkey, 0, STATE - 1)
  if type(raw) ~= 'string' or #raw < STATE then return nil end
  return {struct.unpack(STATE_FMT, raw)}
end

local function pack_head(h) return struct.pack(HEAD_FMT, unpack(h, 1, NFIELDS)) end

local function put_head(tkey, h) redis.call('SETRANGE', tkey, 0, pack_head(h)) end

-- A whole record `raw` with its head replaced by h: written with one SET, where a SET and then
-- a SETRANGE of the head cost a Redis call more (schedule, and a result task in complete).
local function with_head(h, raw) return pack_head(h) .. string.sub(raw, HEAD + 1) end

local function part(tkey, at, len)
  if len == 0 then return '' end
  return redis.call('GETRANGE', tkey, at, at + len - 1)
end

-- The head and the record's first READ_AHEAD bytes after it, in one GETRANGE (nil as for
-- head()): claim goes on to read flow and url, start headers and body, and each takes them
-- from these bytes when they are in them (`part_of`), a Redis call less per part
-- (bench/README.md). A longer record costs one GETRANGE more, as before.
local READ_AHEAD = 1024
local function head_ahead(tkey)
  local raw = redis.pcall('GETRANGE', tkey, 0, HEAD + READ_AHEAD - 1)
  if type(raw) ~= 'string' or #raw < HEAD then return nil end
  return unpack_head(raw), raw
end

-- Bytes at .. at + len - 1 of the record whose first bytes are `raw`.
local function part_of(tkey, raw, at, len)
  if at + len <= #raw then return string.sub(raw, at + 1, at + len) end
  return part(tkey, at, len)
end

local function flow_of(tkey, h) return part(tkey, HEAD, h[FL]) end

-- Head, flow and url: what claim replies and views carry (never headers or body).
local function prefix_of(tkey, h) return part(tkey, 0, HEAD + h[FL] + h[UL]) end

local function headers_at(h) return HEAD + h[FL] + h[UL] end
local function err_at(h) return headers_at(h) + h[HL] + h[BL] end
local function err_of(tkey, h) return part(tkey, err_at(h), h[EL]) end

-- Write the head with a new last_err: the record is rewritten (only when the text changes;
-- SETRANGE cannot shrink a string, and growing one would over-allocate).
local function put_with_err(tkey, h, err)
  if h[EL] == #err and err_of(tkey, h) == err then return put_head(tkey, h) end
  local middle = part(tkey, HEAD, err_at(h) - HEAD)
  h[EL] = #err
  redis.call('SET', tkey, pack_head(h) .. middle .. err, 'KEEPTTL')
end

-- A task moved by a PATCH after its attempt started keeps that attempt's claim (reschedule.lua)
-- so that its answer still goes into the history (complete.lua). Whether such an attempt is
-- still the holder's to finish or to give up:
local function moved_in_flight(h, claim)
  return h ~= nil and h[CLAIM] == claim and h[STARTED] == 1 and PENDING[h[ST]] == true
end

-- Its holder did not send it after all (release, park): it leaves the count again, and its
-- claim and lease go; the task stays at its new time.
local function moved_unsent(P, key, tkey, h)
  redis.call('ZREM', P .. 'ls', key)
  h[ATT] = h[ATT] - 1
  if h[ATT] == 0 then h[ST] = 's' end
  h[CLAIM], h[STARTED] = NONE, 0
  put_head(tkey, h)
end

-- The refusal of a script that meets a record of the v1 layout (run before any write).
local function old_layout(key)
  return redis.error_reply('OLDLAYOUT task ' .. key .. ' has a record of the v1 layout; ' ..
    'a starting timewheel process migrates them (timewheel/store/migrate.py)')
end
