-- Parked tasks (lua/park.lua): pw:<flow> holds a flow's parked tasks of the bucket by due time,
-- pf each such flow at the due time of its earliest one, pa every parked task of the bucket.

-- Set the flow's entry in pf to its earliest parked task, or drop it when none is left (a
-- stale entry would make every process ask for permits of a flow with nothing to take).
-- Returns whether the flow has parked tasks left here.
local function index_parked_flow(P, flow)
  local first = redis.call('ZRANGE', P .. 'pw:' .. flow, 0, 0, 'WITHSCORES')
  if #first == 0 then
    redis.call('ZREM', P .. 'pf', flow)
    return false
  end
  redis.call('ZADD', P .. 'pf', tonumber(first[2]), flow)
  return true
end

-- A parked task stops waiting without being taken back (cancel, replace).
local function leave_parked(P, flow, key)
  redis.call('ZREM', P .. 'pw:' .. flow, key)
  redis.call('ZREM', P .. 'pa', key)
  index_parked_flow(P, flow)
end
