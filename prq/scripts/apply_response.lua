--[[ apply_response: store a taken request's response (first one wins) and pulse its waiters.

KEYS[1]  request hash          prq:{e}:r:<id>
KEYS[2]  in-flight ids         prq:{e}:run      (the answered id leaves it)
KEYS[3]  limits                prq:{e}:lim      (a limited endpoint's receivers are woken)
KEYS[4]  queued levels         prq:{e}:pri      (present while anything is queued)
KEYS[5]  leased ids            prq:{e}:alo      (an answered at_least_once id leaves it)
ARGV[1]  request id
ARGV[2]  owner token of the receiver that answers
ARGV[3]  response (JSON)
ARGV[4]  response TTL, ms
ARGV[5]  now_ms
ARGV[6]  node channel prefix   prq:node:   (the sender's and watchers' node ids are appended)
ARGV[7]  largest response carried inside the pulse, bytes (larger ones are read by the sender)
ARGV[8]  the endpoint's pulse channel

Reply (a status):
  "ok"         stored and pulsed
  "replay"     this owner had already stored it (a retried call); nothing changed
  "duplicate"  another response was stored first; dropped
  "stale"      the request was withdrawn or cancelled; dropped
  "fenced"     another receiver owns the request now; dropped
  "unknown"    nothing is stored under the id (expired or lost); dropped

Invariants:
- only the owner of a taken request can answer it, and only once
- value and TTL are written together; the request body is dropped with the answer
- a one-way message (notify, "ow") keeps no answer: it is marked done, the answer dropped
]]
-- include: _body
local st, own, snd, watchers, ma, ow, bk = unpack(record_hmget(KEYS[1], {'st', 'own', 'snd',
  'w', 'ma', 'ow', 'bk'}))
if not st then return 'unknown' end
if st == 'done' then
  if own == ARGV[2] then return 'replay' end
  return 'duplicate'
end
if st ~= 'taken' then return 'stale' end
if own ~= ARGV[2] then return 'fenced' end

if ow then
  redis.call('HSET', KEYS[1], 'st', 'done', 'dn', ARGV[5])
else
  redis.call('HSET', KEYS[1], 'st', 'done', 'rsp', ARGV[3], 'dn', ARGV[5])
end
drop_body(KEYS[1], {}, bk)
redis.call('PEXPIRE', KEYS[1], ARGV[4])
redis.call('ZREM', KEYS[2], ARGV[1])
if ma then redis.call('ZREM', KEYS[5], ARGV[1]) end
if redis.call('HEXISTS', KEYS[3], 'mif') == 1 and redis.call('EXISTS', KEYS[4]) == 1 then
  redis.call('PUBLISH', ARGV[8], '')  -- a slot freed: receivers that found none may take again
end

local msg = 'r|' .. ARGV[1] .. '|'
if string.len(ARGV[3]) <= tonumber(ARGV[7]) then
  msg = msg .. ARGV[3]
end
if snd then
  redis.call('PUBLISH', ARGV[6] .. snd, msg)
end
if watchers then
  for node in string.gmatch(watchers, '%S+') do
    redis.call('PUBLISH', ARGV[6] .. node, msg)
  end
end
return 'ok'
