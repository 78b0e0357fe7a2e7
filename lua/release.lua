-- lib: record, slices
-- release: hand claims back that were never started (shutdown, or a start deadline missed),
-- so any process can claim them at once instead of after their lease.
--
-- KEYS[1]  bucket prefix "{<prefix>:<bucket>}:"
-- ARGV[1..] key, token pairs
--
-- Reply: one number per pair: 1 handed back, 0 not the caller's claim or already started
--        (an attempt that began keeps its lease: its outcome is unknown).
local P = KEYS[1]
local out = {}
for i = 1, #ARGV, 2 do
  local key = ARGV[i]
  local tkey = P .. 't:' .. key
  local h = head(tkey)
  if not h or h[ST] ~= 'd' or h[CLAIM] ~= digest(ARGV[i + 1]) or h[STARTED] == 1 then
    out[#out + 1] = 0
  else
    local minute = slice_minute(P, h[DUE], h[DUE])
    redis.call('ZREM', P .. 'ls', key)
    h[ST] = h[ATT] == 0 and 's' or 'r'
    h[CLAIM] = NONE
    put_head(tkey, h)
    into_slice(P, key, h[DUE], minute)
    out[#out + 1] = 1
  end
end
return out
