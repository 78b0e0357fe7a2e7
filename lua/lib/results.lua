-- A task's result callbacks (docs/api.md v3, "Result callbacks"): P .. 'r:' .. key holds the
-- URLs of on_success and on_failure as "<on_success>\n<on_failure>" (either may be empty; URLs
-- hold no line breaks), only for a task that has one, so a task without pays nothing. The key
-- lives and expires with the record: no TTL while the task is pending, the record's from the
-- moment it finishes (complete, cancel); replay and a re-create make it pending again.

local function results_key(P, key) return P .. 'r:' .. key end

local function results_of(P, key)
  local value = redis.call('GET', results_key(P, key))
  if not value then return '' end
  return value
end

local function expire_results(P, key, ttl) redis.call('PEXPIRE', results_key(P, key), ttl) end
local function keep_results(P, key) redis.call('PERSIST', results_key(P, key)) end
