-- lib: record, slices, results, creating, memory
-- publish: the tasks of one topic publish (POST /topics/{name}/publish): all created, or none.
--
-- KEYS[1]  the home bucket prefix "{<prefix>:<bucket>}:", the publish key's bucket, which holds
--          the publish's record P pb:<publish key> (hash: fp, op, st open|done|partial, rec,
--          and while it is open t:<task key> -> the task's record and u:<task key> -> its
--          result callbacks, for whoever completes it)
--          and, while it is open, its entry in P po (publish key -> opened ms).
-- KEYS[2..] the prefixes of the buckets its tasks are in (mode "all" only).
--          On one Redis, mode "all" is the whole publish in one call, whatever buckets its
--          tasks are in. On a Redis Cluster a call may touch one slot, so store/publish.py runs
--          the publish as calls of the other modes, each naming KEYS[1] only (docs/design.md,
--          "Topics").
-- ARGV[1]  mode:
--            all    check the publish record and every task, then write them all (one Redis)
--            record check the publish record, write nothing (cluster, before step 0: a repeat
--                   is answered from the record, whatever its tasks would be now)
--            check  check the tasks of KEYS[1]'s bucket, write nothing (cluster, step 0);
--                   refused like a write when that bucket's master is full (over maxmemory),
--                   so a publish is refused whole before it is opened
--            open   check the publish record, write it open with its tasks' records
--                   (cluster, step 1; the tasks are not checked here)
--            tasks  check, then write, the tasks of KEYS[1]'s bucket (cluster, step 2)
--            close  mark the record ARGV[6] ("done", or "partial": a task key was taken
--                   meanwhile) and drop the tasks' records, if it is still open (cluster,
--                   step 3; a sweep and the call itself may both close it)
-- ARGV[2]  publish key
-- ARGV[3]  now_ms
-- ARGV[4]  request id, unique per API call: a call re-sent by redis-py answers as before
-- ARGV[5]  the publish's fingerprint (topic and request): a repeat with another one conflicts
-- ARGV[6]  the record kept for a repeat (JSON: topic, endpoints, task keys, created)
-- ARGV[7]  ms the publish record is kept from now (its latest due time + the retention)
-- ARGV[8..] per task, four values: its bucket prefix's position in KEYS, its key, its record
--          (timewheel/store/layout.py `template`), its result callbacks as lua/lib/results.lua
--          stores them ("" for none)
--
-- Reply: PublishReply (timewheel/store/replies.py), as {code, detail}
--    0 CREATED        written (detail: the keys of tasks that existed already, identical);
--                     for mode record: there is no record
--    1 EXISTS         the same publish exists (detail: its record); nothing written
--   -1 CONFLICT       the publish key belongs to another publish; nothing written
--   -2 TASK_CONFLICT  a task's key holds another task (detail: that key); nothing written
local home, mode, pkey, now = KEYS[1], ARGV[1], ARGV[2], tonumber(ARGV[3])
local op, fp = digest(ARGV[4]), ARGV[5]
local rkey = home .. 'pb:' .. pkey

local function record_check()
  local old = redis.call('HMGET', rkey, 'fp', 'op', 'st', 'rec')
  if not old[1] then return nil end
  if old[2] == op then return {0, {}} end  -- this very call, re-sent
  if old[1] ~= fp then return {-1, ''} end
  return {1, old[4], old[3]}
end

if mode == 'close' then
  -- Closed already (a sweep that read the record while open, after the call closed it
  -- "partial", must not turn it "done"), or expired meanwhile: only its open entry goes.
  local open = redis.call('HGET', rkey, 'st') == 'open'
  redis.call('ZREM', home .. 'po', pkey)
  if not open then return {0, {}} end
  local fields = redis.call('HKEYS', rkey)
  for _, f in ipairs(fields) do
    local kind = string.sub(f, 1, 2)
    if kind == 't:' or kind == 'u:' then redis.call('HDEL', rkey, f) end
  end
  redis.call('HSET', rkey, 'st', ARGV[6])
  return {0, {}}
end

if mode == 'all' or mode == 'open' or mode == 'record' then
  local found = record_check()
  if found then return found end
  if mode == 'record' then return {0, {}} end
end
if mode == 'open' then
  -- No check can fail now; writes follow.
  redis.call('HSET', rkey, 'fp', fp, 'op', op, 'st', 'open', 'rec', ARGV[6])
  for i = 8, #ARGV, 4 do
    redis.call('HSET', rkey, 't:' .. ARGV[i + 1], ARGV[i + 2])
    if ARGV[i + 3] ~= '' then redis.call('HSET', rkey, 'u:' .. ARGV[i + 1], ARGV[i + 3]) end
  end
  redis.call('PEXPIRE', rkey, ARGV[7])
  redis.call('ZADD', home .. 'po', now, pkey)
  return {0, {}}
end

-- The tasks: each new, or identical to one that exists (a publish completed by a repeat, or
-- its task made before by hand with the same content); another task under a key refuses all.
local tasks, existing = {}, {}
for i = 8, #ARGV, 4 do
  local P = KEYS[tonumber(ARGV[i])]
  local key, new, results = ARGV[i + 1], ARGV[i + 2], ARGV[i + 3]
  local h = new_head(new)
  if not h then return redis.error_reply('ERR publish: malformed record for ' .. key) end
  local old, other = head(P .. 't:' .. key)
  if other then return old_layout(key) end
  if old then
    if old[FP] ~= h[FP] then return {-2, key} end
    existing[#existing + 1] = key
  else
    tasks[#tasks + 1] = {P, key, new, h, results}
  end
end
if mode == 'check' then
  -- Step (0) on each master: one that is full refuses the publish now, before (1) opens it,
  -- not at (2), when the other masters' tasks would already be created (and sent).
  refuse_when_full(KEYS[1])
  return {0, existing}
end

-- All checks are done; writes follow.
for _, t in ipairs(tasks) do write_task(t[1], t[2], t[3], t[4], now, op, 0, t[5], false) end
if mode == 'all' then
  redis.call('HSET', rkey, 'fp', fp, 'op', op, 'st', 'done', 'rec', ARGV[6])
  redis.call('PEXPIRE', rkey, ARGV[7])
end
return {0, existing}
