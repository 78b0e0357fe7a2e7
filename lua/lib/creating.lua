-- Writing a new task's record, as lua/schedule.lua and lua/publish.lua do (needs record, slices,
-- results).

-- The head of a record built by timewheel/store/layout.py `template`, or nil when its lengths
-- do not add up (a malformed argument: the caller refuses it before any write).
local function new_head(new)
  local h = unpack_head(new)
  if #new ~= HEAD + h[FL] + h[UL] + h[HL] + h[BL] + h[EL] then return nil end
  return h
end

-- Store the record `new` (head `h`) under `key` and put it into its minute's slice. `op` is
-- the request's digest and `reply` what a re-sent call answers (record fields op, opr).
-- `results`: the task's result callbacks as lua/lib/results.lua stores them ("" for none);
-- `replaced`: a record was there before, whose result callbacks a task without any drops.
local function write_task(P, key, new, h, now, op, reply, results, replaced)
  local tkey = P .. 't:' .. key
  local due = h[DUE]
  local minute = slice_minute(P, due, now)
  h[CREATED], h[OP], h[OPR] = now, op, reply
  redis.call('SET', tkey, with_head(h, new))  -- also drops a finished record's retention TTL
  into_slice(P, key, due, minute)
  if results ~= '' then
    redis.call('SET', results_key(P, key), results)  -- no TTL: the task is pending
  elseif replaced then
    redis.call('DEL', results_key(P, key))
  end
end
