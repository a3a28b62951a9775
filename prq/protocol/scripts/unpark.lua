--[[ unpark: a receiver that stops taking (it shuts down, or its take was cancelled) withdraws a
take token's park and gives back what the token was handed and never collected.

KEYS[1]  parked tokens         prq:{e}:parked   (list, oldest first)
KEYS[2]  park details          prq:{e}:parks    (hash: token -> "<node>|<until, server ms>")
KEYS[3]  take receipt          prq:{e}:t:<token>
KEYS[4]  request hash prefix   prq:{e}:r:   (ids are appended; same hash tag, same slot)
KEYS[5]  in-flight ids         prq:{e}:run      (KEYS[5..10]: for what is given back,
KEYS[6]  hand-offs             prq:{e}:ho        _handoff.lua)
KEYS[7]  queued levels         prq:{e}:pri
KEYS[8]  level prefix          prq:{e}:l:
KEYS[9]  take receipt prefix   prq:{e}:t:
KEYS[10] leased ids            prq:{e}:alo
ARGV[1]  owner token
ARGV[2]  how long a hand-off may wait for its receiver's confirmation, ms
ARGV[3]  TTL of a taken request, ms
ARGV[4]  TTL of a take receipt, ms
ARGV[5]  queue TTL, ms
ARGV[6]  request TTL beyond its pickup window, ms
ARGV[7]  the endpoint's pulse channel
ARGV[8]  node channel prefix   prq:node:

Reply: how many requests the token owned and gave back.

Invariants:
- after this step nothing more is handed to the token: its park is gone, in the same step as
  the receipt is read, so no hand-off can slip in between
- the receiver calls this only for a take that never returned what it got, so nothing on the
  receipt ran: each request the token still owns (handed, or taken by a take whose reply was
  lost) goes at once to the next live park or back to the front of its level (_handoff.lua),
  its attempt not counted, whatever its delivery mode
- the token is not used again: its receipt is replaced by a mark ("!", never a request id)
  for a receipt's TTL, so that a take of the token still on its way (sent before this step on
  another connection, or retried, and run after it) takes nothing and does not park; a take
  that ran before it had its requests given back here, and its receiver drops its reply
]]
-- include: _body
-- include: _queue
-- include: _handoff
if redis.call('HDEL', KEYS[2], ARGV[1]) == 1 then
  redis.call('LREM', KEYS[1], 1, ARGV[1])
end
local k = {parked = KEYS[1], parks = KEYS[2], receipt_prefix = KEYS[9], run = KEYS[5],
  handoffs = KEYS[6], levels = KEYS[7], prefix = KEYS[8], lease = KEYS[10]}
local o = {confirm_ms = ARGV[2], in_flight_ttl = ARGV[3], receipt_ttl = ARGV[4],
  list_ttl = ARGV[5], extra_ttl = ARGV[6], pulse = ARGV[7], node_prefix = ARGV[8]}
local given = 0
local now = nil
for _, id in ipairs(redis.call('LRANGE', KEYS[3], 0, -1)) do
  k.hash = KEYS[4] .. id
  local st, own = unpack(record_get(k.hash, {'st', 'own'}))
  if own == ARGV[1] and (st == 'handed' or st == 'taken') then
    now = now or server_ms()
    if st == 'handed' then reclaim(k, id, now, o, false) else untake(k, id, now, o) end
    given = given + 1
  end
end
redis.call('DEL', KEYS[3])
redis.call('RPUSH', KEYS[3], '!')
redis.call('PEXPIRE', KEYS[3], ARGV[4])
return given
