--[[ hand_back: a receiver that shuts down gives back a request it holds and will not answer.

KEYS[1]  request hash          prq:{e}:r:<id>
KEYS[2]  in-flight ids         prq:{e}:run
KEYS[3]  leased ids            prq:{e}:alo
KEYS[4]  queued levels         prq:{e}:pri
KEYS[5]  level prefix          prq:{e}:l:
KEYS[6]  dead-lettered ids     prq:{e}:dead     (KEYS[6..8]: the dead-letter keys, _dead.lua)
KEYS[7]  their details         prq:{e}:deadm
KEYS[8]  their stored bytes    prq:{e}:deadb
ARGV[1]  request id
ARGV[2]  owner token of the receiver that gives it back
ARGV[3]  request TTL beyond its pickup window, ms
ARGV[4]  queue TTL, ms
ARGV[5]  TTL of a dead letter, ms
ARGV[6]  most dead letters kept
ARGV[7]  the endpoint's pulse channel
ARGV[8]  node channel prefix   prq:node:

Reply: the request's state afterwards:
  "queued"     at_least_once: queued again at the front of its level (_redeliver.lua), for
               another receiver; the attempt it used counts
  "cancelled"  at_most_once: cancelled with reason "receiver_shutdown" (it may have run; its
               caller is told at once), or at_least_once with its attempts used up
  anything else: the receiver did not own it any more (answered, cancelled, fenced); unchanged

Invariants:
- only the owner gives a request back, in one atomic step with the check
- an at_most_once request is never handed out again
]]
-- include: _body
-- include: _queue
-- include: _dead
-- include: _redeliver
local st, own, ma, snd, watchers = unpack(record_hmget(KEYS[1], {'st', 'own', 'ma', 'snd',
  'w'}))
if not st then return 'missing' end
if st ~= 'taken' then return st end
if own ~= ARGV[2] then return 'fenced' end
local now = server_ms()
if ma then
  local k = {hash = KEYS[1], run = KEYS[2], lease = KEYS[3], levels = KEYS[4], prefix = KEYS[5],
    dead = {KEYS[6], KEYS[7], KEYS[8]}}
  local o = {extra_ttl = ARGV[3], list_ttl = ARGV[4], dead_ttl = ARGV[5], dead_cap = ARGV[6],
    pulse = ARGV[7], node_prefix = ARGV[8]}
  return redeliver(k, ARGV[1], now, o)
end
redis.call('HSET', KEYS[1], 'st', 'cancelled', 'why', 'receiver_shutdown', 'dn', now)
drop_body(KEYS[1], {})
redis.call('ZREM', KEYS[2], ARGV[1])
local msg = 'r|' .. ARGV[1] .. '|'
if snd then redis.call('PUBLISH', ARGV[8] .. snd, msg) end
if watchers then
  for node in string.gmatch(watchers, '%S+') do redis.call('PUBLISH', ARGV[8] .. node, msg) end
end
return 'cancelled'
