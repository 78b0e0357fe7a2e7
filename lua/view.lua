-- lib: record
-- view: what GET /tasks/{key} and the listings show of tasks: the records without their
-- headers and body (a view of a task with a 1 MiB body moves a few hundred bytes).
--
-- KEYS[1]  bucket prefix "{<prefix>:<bucket>}:"
-- ARGV[1..] task keys of this bucket
--
-- Reply: two values per key: the record's head, flow and url, and its last_err; "" and ""
--        when there is no such task, "v1" and "" when its record has the v1 layout.
local P = KEYS[1]
local out = {}
for i = 1, #ARGV do
  local tkey = P .. 't:' .. ARGV[i]
  local h, other = head(tkey)
  if h then
    out[#out + 1] = prefix_of(tkey, h)
    out[#out + 1] = err_of(tkey, h)
  else
    out[#out + 1] = other and 'v1' or ''
    out[#out + 1] = ''
  end
end
return out
