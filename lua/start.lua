-- lib: record, results
-- start: mark attempts as begun, just before they are sent, and hand over what they send.
-- Only a caller that still holds the claim may start: a task cancelled or replaced after it
-- was claimed is not sent. Headers and body are read here, not at claim time, so a claim
-- reply and the tasks a process holds cost a few hundred bytes each whatever the body; with
-- the head, in one GETRANGE when they fit in its read-ahead (lua/lib/record.lua head_ahead).
--
-- KEYS[1..n]  bucket prefixes "{<prefix>:<bucket>}:". One on a Redis Cluster (each bucket is its
--             own slot; the client may add a guard key after it, ignored here); any number on a
--             single Redis, where one call starts what every bucket has due (a call costs the
--             service ~65 us of CPU however few claims it carries: bench/README.md).
-- ARGV[1]     n, the number of prefixes
-- ARGV[2..n+1] how many key, token pairs belong to each prefix, in KEYS order
-- ARGV[n+2..] the pairs, prefix by prefix
--
-- Reply: four values per pair, in ARGV order: the attempt number (1, 2, ...), the headers and
--        the body as stored (timewheel/store/layout.py), and the task's result callbacks' URLs
--        (lua/lib/results.lua, "" for none: the executor keeps the answer's body for them);
--        or 0, "", "", "" when the claim is not the caller's any more (do not send).
--        Idempotent: starting a started attempt again (a retried call) returns the same
--        number.
local n = tonumber(ARGV[1])
local out = {}
local tokens = {}
local i = n + 2
for k = 1, n do
  local P = KEYS[k]
  for _ = 1, tonumber(ARGV[k + 1]) do
    local key, token = ARGV[i], ARGV[i + 1]
    local tkey = P .. 't:' .. key
    i = i + 2
    tokens[token] = tokens[token] or digest(token)
    local h, raw = head_ahead(tkey)
    if h and h[ST] == 'd' and h[CLAIM] == tokens[token] then
      if h[STARTED] == 0 then
        h[ATT], h[STARTED] = h[ATT] + 1, 1
        put_head(tkey, h)
      end
      local at = headers_at(h)
      out[#out + 1] = h[ATT]
      out[#out + 1] = part_of(tkey, raw, at, h[HL])
      out[#out + 1] = part_of(tkey, raw, at + h[HL], h[BL])
      out[#out + 1] = results_of(P, key)
    else
      out[#out + 1] = 0
      out[#out + 1] = ''
      out[#out + 1] = ''
      out[#out + 1] = ''
    end
  end
end
return out
