-- A full Redis (over maxmemory, noeviction) refuses a command that adds data only while the
-- script has changed nothing: a script whose first change is a delete runs whole past the
-- limit (Redis's scriptVerifyOOM). A script that creates or configures, and may delete first,
-- calls this where its checks end and its writes begin.

-- An empty SETRANGE of a key that does not exist writes nothing, but Redis checks it as the
-- data-adding command it is: when full, the script stops here with an OOM error, unchanged.
local function refuse_when_full(P)
  redis.call('SETRANGE', P .. 'full?', 0, '')
end
