--[[ apply_response: store the responses of taken requests of one endpoint (the first one for a
request wins) and pulse their waiters. One call answers one request or many: a receiver's
answers that are ready together go in one call (prq.protocol.scripts.merging.merge_answers).

KEYS[1]  in-flight ids         prq:{e}:run      (the answered ids leave it)
KEYS[2]  limits                prq:{e}:lim      (a limited endpoint's receivers are woken)
KEYS[3]  queued levels         prq:{e}:pri      (present while anything is queued)
KEYS[4]  leased ids            prq:{e}:alo      (an answered at_least_once id leaves it)
KEYS[5]  request hash prefix   prq:{e}:r:       (ids are appended; same hash tag, same slot)
ARGV[1]  node channel prefix   prq:node:   (the sender's and watchers' node ids are appended)
ARGV[2]  largest response carried inside the pulse, bytes (larger ones are read by the sender)
ARGV[3]  the endpoint's pulse channel
ARGV[4]  '0' when the receiver knows the endpoint has no max_in_flight limit (its last take
         said so: take.lua), so that no receiver can wait for the slots these answers free;
         '1' to look
ARGV[5]  the shortest an answer someone waits for is kept, ms (QueueSettings
         .waited_response_ttl_s): an answer whose request has a sender or watchers is kept at
         least this long, whatever its own TTL
ARGV[6..] one group of ANSWER_ARGS values per answer:
         request id, owner token of the receiver that answers, response (JSON),
         response TTL (ms), now_ms

Pulses: each answer's waiters (its sender and watchers) get `r|<id>|<response or empty>` on their
node channel; the answers of one call that go to one channel go in one message,
`m|<len>|<message><len>|<message>...` (each message as it would go alone, its length in bytes
before it), so a node answered many times at once costs Redis one PUBLISH.

Reply: one status per answer, in order:
  "ok"         stored and pulsed
  "replay"     this owner had already stored it (a retried call); nothing changed
  "duplicate"  another response was stored first; dropped
  "stale"      the request was withdrawn or cancelled; dropped
  "fenced"     another receiver owns the request now; dropped
  "unknown"    nothing is stored under the id (expired or lost); dropped

Invariants:
- only the owner of a taken request can answer it, and only once
- value and TTL are written together; the request body is dropped with the answer (its fields
  emptied in the same write: blank_body)
- an answer that a caller waits for (the request names a sender, or has watchers) outlives the
  caller's next poll: a caller that missed the pulse then still reads it, and a record such a
  caller finds gone sooner was lost, not expired (prq.protocol.flows.call). A detached answer
  (nobody waits; its readers tell expiry from loss themselves: prq.bulk.LossWatch) is kept
  exactly its TTL
- a one-way message (notify, "ow") keeps no answer: it is marked done, the answer dropped
- each answer is judged alone: one call's answers may be for requests in any state
]]
-- include: _body
local ANSWER_ARGS = 5
local first = 6
local waited_ttl = tonumber(ARGV[5])
local statuses, answered, leased = {}, {}, {}
local inline_max = tonumber(ARGV[2])
-- the pulses to send, by channel, in the order the channels first came
local channels, pulses = {}, {}

local function pulse(channel, msg)
  local queued = pulses[channel]
  if queued then
    queued[#queued + 1] = msg
  else
    channels[#channels + 1] = channel
    pulses[channel] = {msg}
  end
end

local function answer(id, token, response, ttl, now)
  local key = KEYS[5] .. id
  local st, own, snd, watchers, ma, ow, bk = unpack(record_hmget(key, {'st', 'own', 'snd', 'w',
    'ma', 'ow', 'bk'}))
  if not st then return 'unknown' end
  if st == 'done' then
    if own == token then return 'replay' end
    return 'duplicate'
  end
  if st ~= 'taken' then return 'stale' end
  if own ~= token then return 'fenced' end

  local fields = {'st', 'done', 'dn', now}
  if not ow then
    fields[5] = 'rsp'
    fields[6] = response
  end
  redis.call('HSET', key, unpack(blank_body(fields, bk)))
  if (snd or watchers) and tonumber(ttl) < waited_ttl then ttl = waited_ttl end
  redis.call('PEXPIRE', key, ttl)
  answered[#answered + 1] = id
  if ma then leased[#leased + 1] = id end

  local msg = 'r|' .. id .. '|'
  if string.len(response) <= inline_max then msg = msg .. response end
  if snd then pulse(ARGV[1] .. snd, msg) end
  if watchers then
    for node in string.gmatch(watchers, '%S+') do pulse(ARGV[1] .. node, msg) end
  end
  return 'ok'
end

for i = first, #ARGV - ANSWER_ARGS + 1, ANSWER_ARGS do
  statuses[#statuses + 1] = answer(ARGV[i], ARGV[i + 1], ARGV[i + 2], ARGV[i + 3], ARGV[i + 4])
end
for _, channel in ipairs(channels) do
  local msgs = pulses[channel]
  if #msgs == 1 then
    redis.call('PUBLISH', channel, msgs[1])
  else
    local framed = {'m|'}
    for _, msg in ipairs(msgs) do
      framed[#framed + 1] = string.len(msg) .. '|' .. msg
    end
    redis.call('PUBLISH', channel, table.concat(framed))
  end
end
if #answered > 0 then
  redis.call('ZREM', KEYS[1], unpack(answered))
  if #leased > 0 then redis.call('ZREM', KEYS[4], unpack(leased)) end
  if ARGV[4] ~= '0' and redis.call('HEXISTS', KEYS[2], 'mif') == 1
      and redis.call('EXISTS', KEYS[3]) == 1 then
    redis.call('PUBLISH', ARGV[3], '')  -- slots freed: receivers that found none may take again
  end
end
return statuses
