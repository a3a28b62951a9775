--[[ withdraw: the sender takes back a request that no receiver has picked up yet.

KEYS[1]  request hash          prq:{e}:r:<id>
KEYS[2]  pending list          prq:{e}:q   (the withdrawn id leaves it)
ARGV[1]  reason                "pickup_timeout", "cancelled", "call_timeout", ...
ARGV[2]  TTL of the tombstone left behind, ms
ARGV[3]  now_ms
ARGV[4]  node channel prefix   prq:node:   (the sender and watchers are told, so they stop waiting)
ARGV[5]  request id
ARGV[6]  nonce of this withdraw call (the same when the call is retried)

Reply: {state, response, reason, mine}
  mine  = 1 when this call (this nonce) withdrew the request, also on a replay; else 0
  state = "withdrawn"   withdrawn (by this call, or earlier by another)
          "taken", "done", "cancelled"   too late: the request is in that state; response and
                        reason are filled in where the state has them
          "missing"     nothing is stored under the id (expired or lost)

Invariants:
- a withdrawn request is never handed out: its id leaves the list, and take would skip it
  anyway; the list's length is then the queue depth, but for ids of senders that died without
  withdrawing, which stay until a take skips them (past their pickup deadline)
- LREM scans from the head: cheap for a pickup timeout (the request sits near the head), O(n)
  for a request deep in a long list (about 1.5 ms per 100,000 ids ahead of it)
- the tombstone keeps the reason (for other waiters and status) and has a TTL
]]
local st, rsp, why, wn = unpack(redis.call('HMGET', KEYS[1], 'st', 'rsp', 'why', 'wn'))
if not st then return {'missing', '', '', 0} end
if st == 'queued' then
  redis.call('HSET', KEYS[1], 'st', 'withdrawn', 'why', ARGV[1], 'dn', ARGV[3], 'wn', ARGV[6])
  redis.call('HDEL', KEYS[1], 'b')
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  redis.call('LREM', KEYS[2], 1, ARGV[5])
  local snd, watchers = unpack(redis.call('HMGET', KEYS[1], 'snd', 'w'))
  local msg = 'r|' .. ARGV[5] .. '|'
  if snd then redis.call('PUBLISH', ARGV[4] .. snd, msg) end
  if watchers then
    for node in string.gmatch(watchers, '%S+') do redis.call('PUBLISH', ARGV[4] .. node, msg) end
  end
  return {'withdrawn', '', ARGV[1], 1}
end
local mine = 0
if st == 'withdrawn' and wn == ARGV[6] then mine = 1 end
return {st, rsp or '', why or '', mine}
