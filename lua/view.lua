-- lib: record, results
-- view: what GET /tasks/{key} and the listings show of tasks: the records, with their headers
-- and body while a byte budget lasts (a listing of tasks with 1 MiB bodies must not copy
-- hundreds of MiB in one call).
--
-- KEYS[1]  bucket prefix "{<prefix>:<bucket>}:"
-- ARGV[1]  byte budget for headers and bodies: "" none (read every one). The first task's are
--          always read; after the first task whose headers and body would pass the budget,
--          no more are read.
-- ARGV[2..] task keys of this bucket
--
-- Reply: four values per key: the record's head, flow and url; its last_err; its headers
--        and body, one string (the head has their lengths), or false when left unread
--        (the budget); its result callbacks' URLs (lua/lib/results.lua, "" for none).
--        "", "", "", "" when there is no such task, "v1", "", "", "" when its record has the
--        v1 layout.
local P = KEYS[1]
local budget = tonumber(ARGV[1])
local spent, stopped = 0, false
local out = {}
for i = 2, #ARGV do
  local tkey = P .. 't:' .. ARGV[i]
  local h, other = head(tkey)
  if h then
    out[#out + 1] = prefix_of(tkey, h)
    out[#out + 1] = err_of(tkey, h)
    local size = h[HL] + h[BL]
    stopped = stopped or (budget ~= nil and spent > 0 and spent + size > budget)
    if stopped then
      out[#out + 1] = false
    else
      spent = spent + math.max(size, 1)  -- an empty request still counts: the first is read
      out[#out + 1] = part(tkey, headers_at(h), size)
    end
    out[#out + 1] = results_of(P, ARGV[i])
  else
    out[#out + 1] = other and 'v1' or ''
    out[#out + 1] = ''
    out[#out + 1] = ''
    out[#out + 1] = ''
  end
end
return out
