-- lib: record
-- rekey: put a task's headers and body, sealed anew by `timewheel keys rotate`
-- (timewheel/store/rotation.py), in place of what it read, only if the record still holds what
-- it read: a create, replace or schedule tombstone in between writes another request (its
-- fresh nonce makes even the same plaintext another blob), so a concurrent change is never
-- undone. State changes (claim, start, cancel, complete) keep the request and the
-- fingerprint, and are kept: only the request part and the fingerprint are rewritten.
--
-- KEYS[1]  bucket prefix "{<prefix>:<bucket>}:"
-- ARGV[1]  task key
-- ARGV[2]  the headers part as read (a sealed blob, or plaintext headers)
-- ARGV[3]  the body part as read
-- ARGV[4]  the fingerprint as read (12 bytes)
-- ARGV[5]  the new headers part: the request sealed under the first key
-- ARGV[6]  the new fingerprint (12 bytes)
--
-- Reply: RekeyReply (timewheel/store/replies.py)
--    1 REKEYED
--    0 CHANGED  the record changed since it was read (or has the v1 layout): nothing written
--   -1 GONE     no such task any more
local P = KEYS[1]
local key = ARGV[1]
local tkey = P .. 't:' .. key
local h, other = head(tkey)
if other then return 0 end
if not h then return -1 end
local at = headers_at(h)
if h[FP] ~= ARGV[4] or h[HL] ~= #ARGV[2] or h[BL] ~= #ARGV[3]
    or part(tkey, at, h[HL]) ~= ARGV[2] or part(tkey, at + h[HL], h[BL]) ~= ARGV[3] then
  return 0
end
if #ARGV[6] ~= 12 then
  return redis.error_reply('ERR rekey: a fingerprint is 12 bytes')
end

-- All checks are done; the write follows (keeping a finished record's retention TTL).
local front = part(tkey, HEAD, h[FL] + h[UL])
local err = err_of(tkey, h)
h[FP], h[HL], h[BL] = ARGV[6], #ARGV[5], 0
redis.call('SET', tkey, pack_head(h) .. front .. ARGV[5] .. err, 'KEEPTTL')
return 1
