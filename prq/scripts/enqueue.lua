--[[ enqueue: put one request on its endpoint's pending list, unless its id is already known.

KEYS[1]  request hash          prq:{e}:r:<id>
KEYS[2]  pending list          prq:{e}:q
KEYS[3]  enqueue counter       prq:{e}:seq
ARGV[1]  request id
ARGV[2]  request body (JSON)
ARGV[3]  sender node id (its channel gets the response pulse)
ARGV[4]  now_ms
ARGV[5]  pickup deadline, ms since the epoch
ARGV[6]  request TTL, ms
ARGV[7]  list and counter TTL, ms
ARGV[8]  the endpoint's pulse channel

Reply:
  {"new", counter}                      enqueued; counter = the endpoint's enqueue count so far
  {"known", state, response, reason}    the id is already known; nothing was enqueued, the
                                        sender was only added as a watcher of the outcome

Invariants:
- a known id (queued, taken, answered or withdrawn, until its hash expires) is never pushed
  again, so a replay of this script after a lost reply changes nothing
- the hash is written together with its TTL; the list and counter TTLs are refreshed on push
- the counter only grows while Redis keeps its data (nodes use it to notice a rollback)
]]
local state = redis.call('HGET', KEYS[1], 'st')
if state then
  local snd, watchers, rsp, why = unpack(redis.call('HMGET', KEYS[1], 'snd', 'w', 'rsp', 'why'))
  if snd ~= ARGV[3] then
    watchers = watchers or ''
    if not string.find(' ' .. watchers .. ' ', ' ' .. ARGV[3] .. ' ', 1, true) then
      redis.call('HSET', KEYS[1], 'w', watchers .. ' ' .. ARGV[3])
    end
  end
  return {'known', state, rsp or '', why or ''}
end
redis.call('HSET', KEYS[1], 'st', 'queued', 'b', ARGV[2], 'snd', ARGV[3], 'ct', ARGV[4],
  'pd', ARGV[5], 'att', '0')
redis.call('PEXPIRE', KEYS[1], ARGV[6])
redis.call('RPUSH', KEYS[2], ARGV[1])
redis.call('PEXPIRE', KEYS[2], ARGV[7])
local counter = redis.call('INCR', KEYS[3])
redis.call('PEXPIRE', KEYS[3], ARGV[7])
redis.call('PUBLISH', ARGV[8], '')
return {'new', counter}
