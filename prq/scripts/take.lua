--[[ take: hand out up to N live requests of one endpoint to one receiver.

KEYS[1]  pending list          prq:{e}:q
KEYS[2]  request hash prefix   prq:{e}:r:   (ids are appended; same hash tag, same slot)
KEYS[3]  take receipt          prq:{e}:t:<token>
ARGV[1]  owner token: unique per take call, the same when that call is retried
ARGV[2]  receiver node id
ARGV[3]  now_ms
ARGV[4]  most requests to hand out (>= 1)
ARGV[5]  most ids to pop in this call (bounds the work spent skipping dead ids)
ARGV[6]  TTL of a taken request, ms
ARGV[7]  TTL of the receipt, ms

Reply: {skipped, id1, body1, attempt1, id2, body2, attempt2, ...}
  skipped = ids popped and dropped because their request was gone, final or past its deadline

Invariants:
- a request is handed out only while it is queued and before its pickup deadline, and it leaves
  "queued" in the same step, so two receivers can never both take it
- a replay of the same call (same token) hands out the same requests again and takes nothing new
- a taken request keeps its body (a retried take and redelivery need it) and gets the in-flight
  TTL; the receipt lives only long enough to cover client retries
]]
local out = {0}
local receipt = redis.call('LRANGE', KEYS[3], 0, -1)
if #receipt > 0 then
  for _, id in ipairs(receipt) do
    local st, own, body, att = unpack(redis.call('HMGET', KEYS[2] .. id, 'st', 'own', 'b', 'att'))
    if st == 'taken' and own == ARGV[1] and body then
      out[#out + 1] = id
      out[#out + 1] = body
      out[#out + 1] = att
    end
  end
  return out
end

local now = tonumber(ARGV[3])
local want = tonumber(ARGV[4])
local budget = tonumber(ARGV[5])
local got, skipped = 0, 0
while got < want and budget > 0 do
  local id = redis.call('LPOP', KEYS[1])
  if not id then break end
  budget = budget - 1
  local key = KEYS[2] .. id
  local st, deadline, body, att = unpack(redis.call('HMGET', key, 'st', 'pd', 'b', 'att'))
  deadline = tonumber(deadline)
  if st == 'queued' and body and deadline and deadline >= now then
    att = (tonumber(att) or 0) + 1
    redis.call('HSET', key, 'st', 'taken', 'own', ARGV[1], 'rcv', ARGV[2], 'tk', ARGV[3],
      'att', att)
    redis.call('PEXPIRE', key, ARGV[6])
    redis.call('RPUSH', KEYS[3], id)
    out[#out + 1] = id
    out[#out + 1] = body
    out[#out + 1] = tostring(att)
    got = got + 1
  else
    skipped = skipped + 1
  end
end
if got > 0 then
  redis.call('PEXPIRE', KEYS[3], ARGV[7])
end
out[1] = skipped
return out
