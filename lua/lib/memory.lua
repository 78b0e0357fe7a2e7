-- A full Redis (over maxmemory, noeviction) checks a script's memory only at the first write
-- command the script calls (Redis's scriptVerifyOOM, Redis 6.2 to Valkey 8.1): a script whose
-- first write command removes (DEL, ZREM, even of nothing) then runs whole past the limit. A
-- script that creates or configures, and may remove first, calls this where its checks end,
-- before any other write command.

-- An empty SETRANGE of a key that does not exist writes nothing, but it is the script's first
-- write command and one that adds data: when full, the script stops here with an OOM error,
-- unchanged.
local function refuse_when_full(P)
  redis.call('SETRANGE', P .. 'full?', 0, '')
end

-- The other way: a script that stops something a user must be able to stop while Redis is
-- full (a DELETE of a task: else its callback goes out once Redis has room, before the
-- client's retry) calls this where its checks end. A DEL of a key that does not exist writes
-- nothing and is not checked; after it Redis checks none of the script's writes, and the few
-- bytes they add go past the limit.
local function go_on_when_full(P)
  redis.call('DEL', P .. 'full?')
end
