-- lib: record
-- permits: give back one flow's finished permits, then take new ones, in one atomic step.
--
-- A flow's limits hold over every process of the wheel: a counting semaphore whose holders
-- expire (a process that dies gives its permits back when their leases run out) and, when the
-- flow has a rate, a log of the starts of the last window.
--
-- KEYS[1]  flow prefix "{<prefix>:f:<flow key>}:" (the flow's own hash slot)
-- ARGV[1]  now_ms
-- ARGV[2]  default parallelism, for a flow with none set (TIMEWHEEL_FLOW_PARALLELISM)
-- ARGV[3]  lease_ms: a new permit is held at most this long unless given back
-- ARGV[4]  slack_ms: an attempt whose start is logged for s starts between s and s + slack_ms
--          (the dispatcher asks again when it is later), so a rated flow's window is that much
--          longer: `limit` + 1 logged starts span at least window + slack_ms, and the real
--          starts at least the window, however each of them drifted within its slack
-- ARGV[5]  r, how many permit ids follow to give back whose attempts were (or may have been)
--          sent: ARGV[6 .. 5+r]
-- ARGV[6+r] u, how many permit ids follow to give back whose attempts were never sent:
--          ARGV[7+r .. 6+r+u]. The starts logged for these never happened: they are struck
--          from the rate log (permits taken for parked tasks and given back unused would
--          otherwise fill the window)
-- ARGV[7+r+u ..] permit id, start_ms pairs wanted, in order: start_ms is when that attempt
--          will start (the rate log counts starts when they happen, not when they are let
--          through). A permit id that is already held counts as granted, so a call re-sent
--          after a lost reply answers the same.
--
-- Reply: {granted, wait_ms, in_flight, room, rated, paused, max_attempts, backoff_ms,
--         max_backoff_ms}
--   granted   how many of the wanted ids (the first ones) now hold a permit
--   wait_ms   0 while the flow has room; when it is full or paused: -1 wait for a permit to
--             be given back (parallelism) or a resume, else milliseconds until the rate
--             window has room again
--   in_flight permits held after this call
--   room      how many more permits a call could take right now: 0 at a limit or paused,
--             below 0 when more are held than the parallelism allows (it was lowered)
--   rated     1 when the flow has a rate (its starts are logged)
--   paused    1 when the flow is paused: no new permit is granted (permits given back still
--             are; an id already held still counts as granted)
--   max_attempts, backoff_ms, max_backoff_ms: the flow's retry defaults, 0 where none is set
--
-- Keys: cfg (hash p, r: the limits set by PUT /flows; x: "1" while paused; ma, rb, mb: the
-- retry defaults, attempts and ms; absent = defaults), held (zset permit -> lease expiry ms,
-- and the keeper that keeps it a skiplist, lua/lib/record.lua INDEX_KEEPER),
-- starts (zset permit -> start ms, only while a rate is set). held and starts expire with the
-- last lease, so an idle flow leaves only its cfg.
local P = KEYS[1]
local now, default_p, lease = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local slack = tonumber(ARGV[4])
local r = tonumber(ARGV[5])
local u = tonumber(ARGV[6 + r])
local held, starts = P .. 'held', P .. 'starts'

local cfg = redis.call('HMGET', P .. 'cfg', 'p', 'r', 'x', 'ma', 'rb', 'mb')
local parallelism = tonumber(cfg[1]) or default_p
local rate = tonumber(cfg[2])
local paused = cfg[3] == '1'

-- One ZREM per piece of ids, not one per id (a Redis call each), in pieces Lua's stack takes.
for i = 6, 5 + r, 1000 do redis.call('ZREM', held, unpack(ARGV, i, math.min(i + 999, 5 + r))) end
for i = 7 + r, 6 + r + u, 1000 do
  redis.call('ZREM', held, unpack(ARGV, i, math.min(i + 999, 6 + r + u)))
end
redis.call('ZREMRANGEBYSCORE', held, '-inf', now)

-- Rate: at most `limit` starts in any window of `window` ms. A rate of at least 1 allows its
-- whole part per second; below 1, one start per 1/rate seconds. The log keeps each start for
-- the window and the slack (ARGV[4]), and a start is refused when that span before it already
-- holds `limit` starts (starts logged for later times count too: never more, whatever order
-- the calls come in).
local limit, window
if rate then
  if rate >= 1 then limit, window = math.floor(rate), 1000 + slack
  else limit, window = 1, math.ceil(1000 / rate) + slack end
  redis.call('ZREMRANGEBYSCORE', starts, '-inf', now - window)
  for i = 7 + r, 6 + r + u, 1000 do  -- never sent: their starts never happened
    redis.call('ZREM', starts, unpack(ARGV, i, math.min(i + 999, 6 + r + u)))
  end
else
  redis.call('DEL', starts)
end

-- Counted once (all but the keeper), then by hand; the new permits are added with one ZADD
-- after the loop, the keeper with them (a ZCARD and a ZADD per permit were a Redis call
-- each). `new` holds them meanwhile, so an id wanted twice is held once. The rate log is
-- written as it goes: each start counts for the next one's window.
local in_flight = redis.call('ZCOUNT', held, '-inf', BELOW_KEEPER)
local granted, new, adds = 0, {}, {}
for i = 7 + r + u, #ARGV, 2 do
  local id, start = ARGV[i], tonumber(ARGV[i + 1])
  if not new[id] and not redis.call('ZSCORE', held, id) then
    if paused or in_flight >= parallelism then break end
    if rate and redis.call('ZCOUNT', starts, '(' .. (start - window), '+inf') >= limit then
      break
    end
    new[id] = true
    adds[#adds + 1] = now + lease
    adds[#adds + 1] = id
    in_flight = in_flight + 1
    if rate then redis.call('ZADD', starts, start, id) end
  end
  granted = granted + 1
end
if #adds > 0 then
  adds[#adds + 1] = INDEX_KEEPER_SCORE
  adds[#adds + 1] = INDEX_KEEPER
end
for i = 1, #adds, 1000 do redis.call('ZADD', held, unpack(adds, i, math.min(i + 999, #adds))) end

local room = parallelism - in_flight
if rate then room = math.min(room, limit - redis.call('ZCOUNT', starts, '(' .. (now - window), '+inf')) end
if paused then room = math.min(room, 0) end
local wait = 0
if room <= 0 then
  if paused or in_flight >= parallelism then
    wait = -1
  else
    -- The window reopens when the start `limit` places before the newest leaves it.
    local n = redis.call('ZCARD', starts)
    local leaving = redis.call('ZRANGE', starts, n - limit, n - limit, 'WITHSCORES')
    wait = math.max(1, tonumber(leaving[2]) + window - now)
  end
end
-- The key outlives its longest lease (leases differ between calls: PEXPIRE only extends).
if in_flight > 0 and redis.call('PTTL', held) < lease then redis.call('PEXPIRE', held, lease) end
local rated = 0
if rate then
  rated = 1
  if redis.call('EXISTS', starts) == 1 then
    local newest = redis.call('ZRANGE', starts, -1, -1, 'WITHSCORES')
    redis.call('PEXPIRE', starts, math.max(1, tonumber(newest[2]) + window - now))
  end
end
return {granted, wait, in_flight, room, rated, paused and 1 or 0, tonumber(cfg[4]) or 0,
        tonumber(cfg[5]) or 0, tonumber(cfg[6]) or 0}
