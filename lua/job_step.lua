-- lib: record, slices, parking, attempts, results, cancelling, replaying, matching
-- job_step: one step of a bulk job (POST /tasks/cancel, /tasks/replay) in one bucket. A
-- listing (lua/list.lua, read-only) found the tasks after the job's position in this bucket;
-- this step acts on each that still passes the filter, moves the position past them and adds
-- to the counts, in one atomic script, so a step is taken once: a second process (or a retry)
-- that brings the same step finds the position moved and writes nothing.
--
-- KEYS[1]  bucket prefix "{<prefix>:<bucket>}:"
-- ARGV[1]  job id
-- ARGV[2]  kind: "cancel" or "replay"
-- ARGV[3]  now_ms
-- ARGV[4]  retention_ms, how long a cancelled record stays readable
-- ARGV[5]  kept: attempts kept per task (TIMEWHEEL_ATTEMPTS_KEPT)
-- ARGV[6]  state_ttl_ms, how long the job's state in this bucket stays after a step
-- ARGV[7..9]   the position the listing started after: source (index of the job's listing
--              source, timewheel/jobs/sources.py), score, key ("" "" at the source's start)
-- ARGV[10..12] the position it reached: the next step starts after it
-- ARGV[13] 1 when the listing read the job's last source to its end: the bucket is done
-- ARGV[14..19] the filter (lua/lib/matching.lua)
-- ARGV[20..] the keys the listing found
--
-- State: P j:<job id>, a hash: src, sc, k (the position), m, d, s (matched, done, skipped),
-- end (1 once the bucket is done). Absent: at the start of source 0.
--
-- Reply: {JobStepReply (timewheel/store/replies.py), matched, done, skipped} (the bucket's
-- totals after the step)
--    1 STEPPED     acted, counted and moved on
--   -1 STALE       the job's position here is not the one given (another process took this
--                  step, or the bucket is done): nothing written
local P = KEYS[1]
local job, kind, now = ARGV[1], ARGV[2], tonumber(ARGV[3])
local retention, kept, ttl = tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6])
local skey = P .. 'j:' .. job
local op = digest('job:' .. job)
local filter = filter_at(ARGV, 14)

local st = redis.call('HMGET', skey, 'src', 'sc', 'k', 'end', 'm', 'd', 's')
local m, d, s = tonumber(st[5]) or 0, tonumber(st[6]) or 0, tonumber(st[7]) or 0
if st[4] == '1' or (st[1] or '0') ~= ARGV[7] or (st[2] or '') ~= ARGV[8]
    or (st[3] or '') ~= ARGV[9] then
  return {-1, m, d, s}
end

-- The filter but for the status: what a task that moved to another index still passes.
local anywhere = {}
for name, value in pairs(filter) do anywhere[name] = value end
anywhere.want, anywhere.rule = 'srwd', ''

-- Every check first: which of the keys are still to act on. A task a cancel cannot act on
-- here, though it is pending and matches but for its status, has moved to another index since
-- the listing (claimed, parked, retried): it is counted where the walk meets it, not here as
-- well (it counted as skipped here and as done there: one task, matched twice).
local acts, heads, moved = {}, {}, 0
for i = 20, #ARGV do
  local key = ARGV[i]
  local h, other = head(P .. 't:' .. key)
  if other then return old_layout(key) end
  if passes(P, key, filter, h, nil, nil)
      and ((kind == 'cancel' and cancellable(h)) or (kind == 'replay' and replayable(h))) then
    acts[#acts + 1], heads[#heads + 1] = key, h
  elseif kind == 'cancel' and cancellable(h) and passes(P, key, anywhere, h, nil, nil) then
    moved = moved + 1
  end
end

for i, key in ipairs(acts) do
  if kind == 'cancel' then cancel_task(P, key, heads[i], now, retention, op, kept)
  else replay_task(P, key, heads[i], now, op) end
end
local found = #ARGV - 19 - moved
m, d, s = m + found, d + #acts, s + found - #acts
redis.call('HSET', skey, 'src', ARGV[10], 'sc', ARGV[11], 'k', ARGV[12], 'm', m, 'd', d, 's', s,
  'end', ARGV[13])
redis.call('PEXPIRE', skey, ttl)
return {1, m, d, s}
