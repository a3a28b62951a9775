--[[ take: hand out up to N live requests of one endpoint to one receiver, or park it.

KEYS[1]  queued levels         prq:{e}:pri      (see _queue.lua)
KEYS[2]  request hash prefix   prq:{e}:r:   (ids are appended; same hash tag, same slot)
KEYS[3]  take receipt          prq:{e}:t:<token>
KEYS[4]  parked tokens         prq:{e}:parked   (list, oldest first)
KEYS[5]  park details          prq:{e}:parks    (hash: token -> "<node>|<until, server ms>")
KEYS[6]  sequence numbers      prq:{e}:sq   (the last one given; _sequence.lua)
KEYS[7]  in-flight ids         prq:{e}:run      (zset: id -> last contact, server ms)
KEYS[8]  limits                prq:{e}:lim      (hash: mif = max in flight; absent = no limit)
KEYS[9]  level prefix          prq:{e}:l:       (the priority is appended; _queue.lua)
KEYS[10] leased ids            prq:{e}:alo      (zset: at_least_once ids in flight -> last contact)
KEYS[11] dead-lettered ids     prq:{e}:dead     (KEYS[11..13]: the dead-letter keys, _dead.lua)
KEYS[12] their details         prq:{e}:deadm
KEYS[13] their stored bytes    prq:{e}:deadb
KEYS[14] hand-offs             prq:{e}:ho       (zset: handed ids -> confirm deadline, server ms)
KEYS[15] the receiver's stamp  prq:{e}:ts:<node> (the server's clock at its last take, µs)
ARGV[1]  owner token: unique per take; reused only while the take comes back empty
ARGV[2]  receiver node id
ARGV[3]  how long a hand-off may wait for its receiver's confirmation, ms (_handoff.lua)
ARGV[4]  most requests to hand out (>= 1)
ARGV[5]  most ids to pop in this call (bounds the work spent skipping dead ids)
ARGV[6]  TTL of a taken request, ms
ARGV[7]  TTL of the receipt, ms
ARGV[8]  park for this long when nothing is taken, ms (0: do not park)
ARGV[9]  TTL of the park keys, the in-flight set, the share count (_queue.lua) and the stamp, ms
ARGV[10] receiver timeout, ms: an in-flight entry not refreshed for this long holds no slot,
         and an at_least_once request whose receiver was silent this long is handed out again
ARGV[11] request TTL beyond its pickup window, ms (for a request handed out again)
ARGV[12] TTL of a dead letter, ms
ARGV[13] most dead letters kept
ARGV[14] the endpoint's pulse channel
ARGV[15] node channel prefix   prq:node:
ARGV[16] the highest stamp this receiver was answered (0: none it can rely on)

Reply: {skipped, counter, redelivered, limited, stamp, went_back, id1, body1, attempt1,
        created1, sequence1, id2, ...}
  created = when the sender enqueued the request (its clock, ms since the epoch)
  sequence = the request's sequence number on the endpoint (enqueue.lua)
  redelivered = at_least_once requests of silent receivers this take queued again or, with
            their attempts used up, dead-lettered (_redeliver.lua)
  skipped = ids popped and dropped because their request was gone, final or past its deadline
  counter = the last sequence number the endpoint gave (0: none): a receiver that read a
            higher one before sending this take knows Redis went back in time
            (prq.node.data_loss)
  limited = 1 when the endpoint has a max_in_flight limit, 0 when it has none, -1 when this
            take did not look (it answered from its receipt): the receiver's answers skip the
            check for freed slots while it knows the endpoint unlimited (apply_response.lua)
  stamp = the receiver's stamp after this take (what it held, when it went back)
  went_back = -1, or what the stamp held when that is below ARGV[16] (0: gone): Redis lost or
            rolled back data since this receiver's last take there, and this take took
            nothing and left the stamp as it found it, so that the receiver declares the loss
            before it takes again, and its other takes already on their way, carrying the
            same ARGV[16], find the stamp low too (prq.node.data_loss: the fence is ARGV[16],
            a server time before the loss; the receiver then sends 0 until a take writes anew)

Invariants:
- the stamp is max(what it held + 1, the clock, ARGV[16] + 1): on one server's data it only
  grows, so it holds less than a stamp this receiver was answered only after Redis lost or
  rolled back data; that is judged in the same step as the take, so no take hands out what a
  rollback behind this receiver's last take brought back before the receiver knows of the loss
  (a data-loss check, which comes later, would be too late: its ghosts would run meanwhile)
- a request is handed out only while it is queued and before its pickup deadline by server time
  (TIME, the clock "pd" is written in), and it leaves "queued" in the same step, so two
  receivers can never both take it
- every id popped leaves "queued" in the same step: one past its deadline (or without a body)
  becomes "withdrawn" (pickup_timeout, redelivery_timeout when it was handed out before, or
  unreadable), so the queue's count of it is lowered once, by the pop; a withdraw or cancel
  lowers it only for a record still queued, hence still in a lane
- a token withdrawn by unpark.lua takes nothing and does not park (its receipt is a mark)
- the receipt lists what was handed to the token (by a take, or by enqueue to a parked token);
  a take whose receipt holds requests the token still owns returns those and takes nothing new,
  so a retried call, or a receiver whose hand-off pulse was lost, gets exactly what the token
  owns; a receipt the token owns nothing of any more (cancelled, reclaimed) is dropped and the
  take goes on as a fresh one
- a receipt lives ARGV[7] from the last take that wrote or read it: long enough for a take
  whose reply was lost to fail and the next take of its token to come (QueueSettings.
  receipt_ttl_s)
- collecting a hand-off from the receipt is its confirmation: "handed" becomes "taken" (the
  pickup: its attempt counts, "tk" is set); before taking, the take reclaims up to 16 hand-offs
  whose confirmation is overdue (_handoff.lua), so a receiver that died parked loses nothing
- "tk" (taken at) is server time (TIME), the clock heartbeats are judged by
- requests are handed out in the order _queue.lua defines (priority with a share for lower
  levels, producers taking turns within a level, FIFO per producer)
- a token is parked only when nothing was queued, so while a live park exists no live request
  waits in the queue (the order is kept); a park expires by server time (TIME), the one clock
  all nodes share, so a receiver that died parked is handed nothing after its park ends
- what is handed out joins the in-flight set; answering, cancelling or declaring a side lost
  removes it (apply_response, cancel, beat, read_response), a beat refreshes its score
- a request whose record names a dedup ledger ('dd', enqueue_many.lua) joins that ledger
  when it is taken, if the ledger still exists (prq:{e}:dd:<token>, beside the records: the
  records' prefix with 'dd:' for 'r:'), so an enqueue with that ledger knows it after its
  record is gone
- at_least_once: what a take hands out joins the lease set too; before taking, the take hands
  out again (or dead-letters) up to 16 leased requests whose receiver was silent past the
  receiver timeout, so a detached request nobody waits on is redelivered as well
- capacity: at most max_in_flight requests are in flight across all receivers, counting the
  entries refreshed within the receiver timeout (a dead receiver's slot frees by itself); a take
  with no free slot gets nothing and does not park (apply_response pulses the endpoint when it
  frees a slot of a limited endpoint with work waiting)
]]
-- include: _body
-- include: _queue
-- include: _dead
-- include: _redeliver
-- include: _handoff
-- include: _sequence
if redis.call('HDEL', KEYS[5], ARGV[1]) == 1 then
  redis.call('LREM', KEYS[4], 1, ARGV[1])
end

local known = tonumber(ARGV[16]) or 0
local held = tonumber(redis.call('GET', KEYS[15]) or '0') or 0
local out = {0, tonumber(redis.call('GET', KEYS[6]) or '0'), 0, -1, held, -1}
if known > 0 and held < known then
  out[6] = held
  return out
end
local stamp = math.max(held + 1, clock_us(), known + 1)
redis.call('SET', KEYS[15], number_text(stamp), 'PX', ARGV[9])
out[5] = stamp
local HEAD = #out
local now_server = server_ms()

-- a request picked up now joins the in-flight set (and the lease set, if at_least_once)
local function in_flight(id, ma)
  redis.call('ZADD', KEYS[7], now_server, id)
  if ma then
    redis.call('ZADD', KEYS[10], now_server, id)
    redis.call('PEXPIRE', KEYS[10], ARGV[9])
  end
end

local function hand_out(id, body, att, ct, sq)
  out[#out + 1] = id
  out[#out + 1] = body
  out[#out + 1] = tostring(att)
  out[#out + 1] = ct or '0'
  out[#out + 1] = sq or '0'
end

local receipt = redis.call('LRANGE', KEYS[3], 0, -1)
if receipt[1] == '!' then return out end  -- the token was withdrawn (unpark.lua): nothing
if #receipt > 0 then
  for _, id in ipairs(receipt) do
    local key = KEYS[2] .. id
    local read = record_get(key, {'st', 'own', 'att', 'ct', 'sq', 'ma', 'b', 'bk',
      unpack(BODY_AHEAD)})
    local st, own, att, ct, sq, ma = unpack(read, 1, 6)
    local body = body_read(key, read, 7)
    if (st == 'taken' or st == 'handed') and own == ARGV[1] and body then
      if st == 'handed' then  -- confirmed: picked up now
        att = tostring((tonumber(att) or 0) + 1)
        redis.call('HSET', key, 'st', 'taken', 'tk', now_server, 'att', att)
        redis.call('HDEL', key, 'ho')
        redis.call('ZREM', KEYS[14], id)
        in_flight(id, ma)
      end
      hand_out(id, body, att, ct, sq)
    end
  end
  if #out > HEAD then
    redis.call('PEXPIRE', KEYS[3], ARGV[7])  -- it lives on for this take's token
    return out
  end
  redis.call('DEL', KEYS[3])
end

local timeout = tonumber(ARGV[10])

-- hand-offs to receivers that did not confirm them in time go to a live receiver
local kh = {parked = KEYS[4], parks = KEYS[5], receipt_prefix = KEYS[3]:sub(1, -#ARGV[1] - 1),
  request_prefix = KEYS[2], run = KEYS[7], handoffs = KEYS[14], levels = KEYS[1],
  prefix = KEYS[9]}
local oh = {confirm_ms = ARGV[3], in_flight_ttl = ARGV[6], receipt_ttl = ARGV[7],
  list_ttl = ARGV[9], extra_ttl = ARGV[11], pulse = ARGV[14], node_prefix = ARGV[15]}
-- (one EXISTS for the two sets scanned below: an endpoint with neither hand-offs nor
-- at_least_once requests in flight, the common case, scans neither)
local scans = redis.call('EXISTS', KEYS[14], KEYS[10]) > 0
if scans then reclaim_overdue(kh, now_server, oh) end

-- at_least_once requests whose receiver went silent go back to the queue (or to dead letters)
local k = {run = KEYS[7], lease = KEYS[10], levels = KEYS[1], prefix = KEYS[9],
  dead = {KEYS[11], KEYS[12], KEYS[13]}}
local o = {extra_ttl = ARGV[11], list_ttl = ARGV[9], dead_ttl = ARGV[12], dead_cap = ARGV[13],
  pulse = ARGV[14], node_prefix = ARGV[15]}
local silent = {}
if scans then
  silent = redis.call('ZRANGE', KEYS[10], '-inf', now_server - timeout, 'BYSCORE', 'LIMIT', 0, 16)
end
for _, id in ipairs(silent) do
  k.hash = KEYS[2] .. id
  local st, hr, tk = unpack(record_get(k.hash, {'st', 'hr', 'tk'}))
  local last = math.max(tonumber(hr) or 0, tonumber(tk) or 0)
  if st ~= 'taken' then
    redis.call('ZREM', KEYS[10], id)
  elseif now_server - last > timeout then
    redeliver(k, id, now_server, o)
    out[3] = out[3] + 1
  else
    redis.call('ZADD', KEYS[10], last, id)  -- beaten lately: the hash knows best
  end
end
local want = tonumber(ARGV[4])
local budget = tonumber(ARGV[5])
local capped = false
local max_in_flight = limit(redis.call('HGET', KEYS[8], 'mif'))
out[4] = max_in_flight and 1 or 0
if max_in_flight then
  local live = redis.call('ZCOUNT', KEYS[7], now_server - tonumber(ARGV[10]), '+inf')
  if live + want > max_in_flight then
    want = max_in_flight - live
    capped = true
  end
end
local got, skipped = 0, 0
local ledgers = {}  -- ledger token -> the ids taken now that name it
local taken, leased = {}, {}  -- the ids taken now; those of them that are at_least_once
local fields_taken = {st = true, own = true, rcv = true, tk = true, att = true}
local names = {'st', 'pd', 'att', 'ct', 'sq', 'ma', 'dd', 'b', 'bk', unpack(BODY_AHEAD)}

-- take one popped id if its record is live; a record still in the queued form (a string,
-- enqueue_many.lua) becomes a hash here, written once with the taken fields. Records queued
-- together tend to be in one form: each read first tries the form the one before it had
local strings = false
local function take_one(id)
  local key = KEYS[2] .. id
  local read, opened = record_read(key, names, strings)
  strings = opened ~= nil
  local st, deadline, att, ct, sq, ma, dd = unpack(read, 1, 7)
  local body = body_read(key, read, 8)
  deadline = tonumber(deadline)
  -- (a record without a deadline is damaged: handed out, its receiver dead-letters it)
  if not (st == 'queued' and body and (not deadline or deadline >= now_server)) then
    skipped = skipped + 1
    if st == 'queued' then
      -- popped, the id is in no lane any more: its record says so (withdrawn, as its caller
      -- would withdraw it at its deadline), or a later withdraw or cancel that finds it
      -- queued would take it out of its level a second time (the level's depth then runs
      -- out while live ids are still in its lanes, and they are never handed out)
      local why = 'unreadable'
      if body then why = (tonumber(att) or 0) > 0 and 'redelivery_timeout' or 'pickup_timeout' end
      if opened then record_open(key) end
      redis.call('HSET', key, 'st', 'withdrawn', 'why', why, 'dn', now_server)
    end
    return
  end
  att = (tonumber(att) or 0) + 1
  local fields = {'st', 'taken', 'own', ARGV[1], 'rcv', ARGV[2], 'tk', now_server, 'att', att}
  if opened then
    opened_fields(fields, opened, fields_taken)
    redis.call('DEL', key)
  end
  redis.call('HSET', key, unpack(fields))
  redis.call('PEXPIRE', key, ARGV[6])
  taken[#taken + 1] = id
  if ma then leased[#leased + 1] = id end
  hand_out(id, body, att, ct, sq)
  got = got + 1
  if dd then
    ledgers[dd] = ledgers[dd] or {}
    table.insert(ledgers[dd], id)
  end
end

while got < want and budget > 0 do
  local ids = queue_pop_many(KEYS[1], KEYS[9], math.min(want - got, budget), ARGV[9])
  if not ids then break end
  for _, id in ipairs(ids) do
    budget = budget - 1
    take_one(id)
  end
end
-- the ids in sorted set `key`, scored now, PUSH_BATCH at a time
local function add_now(key, ids)
  for i = 1, #ids, PUSH_BATCH do
    local scored = {}
    for j = i, math.min(i + PUSH_BATCH - 1, #ids) do
      scored[#scored + 1] = now_server
      scored[#scored + 1] = ids[j]
    end
    redis.call('ZADD', key, unpack(scored))
  end
end

-- what was taken joins the receipt, the in-flight set (and the lease set), in one write each
for i = 1, #taken, PUSH_BATCH do
  redis.call('RPUSH', KEYS[3], unpack(taken, i, math.min(i + PUSH_BATCH - 1, #taken)))
end
add_now(KEYS[7], taken)
if #leased > 0 then
  add_now(KEYS[10], leased)
  redis.call('PEXPIRE', KEYS[10], ARGV[9])
end
-- the ledgers remember what a receiver took, while they live (enqueue_many.lua keeps them)
for token, ids in pairs(ledgers) do
  local ledger = string.sub(KEYS[2], 1, -3) .. 'dd:' .. token
  if redis.call('EXISTS', ledger) == 1 then redis.call('SADD', ledger, unpack(ids)) end
end
if got > 0 then
  redis.call('PEXPIRE', KEYS[3], ARGV[7])
  -- entries not touched for an in-flight TTL belong to requests whose hash has expired
  redis.call('ZREMRANGEBYSCORE', KEYS[7], '-inf', now_server - tonumber(ARGV[6]))
  redis.call('PEXPIRE', KEYS[7], ARGV[9])
elseif not capped and tonumber(ARGV[8]) > 0 and redis.call('EXISTS', KEYS[1]) == 0 then
  local until_ms = now_server + tonumber(ARGV[8])
  redis.call('RPUSH', KEYS[4], ARGV[1])
  redis.call('HSET', KEYS[5], ARGV[1], ARGV[2] .. '|' .. until_ms)
  redis.call('PEXPIRE', KEYS[4], ARGV[9])
  redis.call('PEXPIRE', KEYS[5], ARGV[9])
end
out[1] = skipped
return out
