--[[ enqueue: queue requests for one endpoint, or hand them to parked receivers; once per id.
One call enqueues one request or many: a node's enqueues to one endpoint that go out together
are merged into one call (prq.protocol.scripts.merging.merge_enqueues), each judged as if it came alone, in order.

KEYS[1]  request hash          prq:{e}:r:<id>   (of the first request; KEYS[14..] the others'
         record and stamp keys, in pairs)
KEYS[2]  queued levels         prq:{e}:pri      (see _queue.lua)
KEYS[3]  enqueue counter       prq:{e}:seq
KEYS[4]  parked tokens         prq:{e}:parked
KEYS[5]  park details          prq:{e}:parks    (token -> "<node>|<until, server ms>")
KEYS[6]  take receipt prefix   prq:{e}:t:       (the token is appended; same hash tag)
KEYS[7]  in-flight ids         prq:{e}:run      (zset: id -> last contact, server ms)
KEYS[8]  limits                prq:{e}:lim      (hash: mif, mp; absent = no limit)
KEYS[9]  level prefix          prq:{e}:l:       (the priority is appended; _queue.lua)
KEYS[10] leased ids            prq:{e}:alo      (zset: at_least_once ids in flight -> last contact)
KEYS[11] hand-offs             prq:{e}:ho       (zset: handed ids -> confirm deadline, server ms)
KEYS[12] sequence numbers      prq:{e}:sq       (the last one given; _sequence.lua)
KEYS[13] the sender's stamp    prq:{e}:ss:<node>:<n> (of the first request; of generation n:
         the server's clock at its last enqueue carrying it, µs; stamp.lua writes it afresh)
ARGV[1..18] the first request's values, ARGV[19..36] the second's, and so on:
ARGV[1]  request id
ARGV[2]  request body (JSON)
ARGV[3]  sender node id (its channel gets the response pulse)
ARGV[4]  now_ms
ARGV[5]  how long a hand-off may wait for its receiver's confirmation, ms (_handoff.lua)
ARGV[6]  request TTL, ms
ARGV[7]  queue, counter and park TTL, ms
ARGV[8]  the endpoint's pulse channel
ARGV[9]  node channel prefix   prq:node:   (a parked receiver's node id is appended)
ARGV[10] TTL of a taken request, ms
ARGV[11] TTL of a take receipt, ms
ARGV[12] receiver timeout, ms: an in-flight entry not refreshed for this long holds no slot
ARGV[13] priority (an integer)
ARGV[14] producer (the fairness lane within the priority)
ARGV[15] max attempts: 0 for at_most_once; else the request is at_least_once (_redeliver.lua)
ARGV[16] pickup window, ms: the pickup deadline "pd" is this much after now by server time
         (TIME), the clock every take judges it by
ARGV[17] the highest stamp the sender was answered on the endpoint (0: none it can rely on)
ARGV[18] '1' when this enqueue was sent before (a retry of its step: an earlier attempt may
         have run; prq.protocol.effects.Resend), else '0'

Reply, for one request (a call of several answers a list of these, one per request, in order;
each but "back" ends with the sender's stamp after the call and `low`: what the stamp held when
it was below ARGV[17] (0: gone), else -1):
  {"new", sq, before, stamp, low}       queued (and the endpoint pulsed if a receiver is
                                        parked); sq = its sequence number, before = the last
                                        number the endpoint gave before this call (0: none)
  {"handed", sq, before, stamp, low}    handed to a parked receiver (_handoff.lua): "handed" to
                                        its token, listed in its receipt, and its node pulsed
                                        "t|<token>|<id>"; not picked up until the receiver
                                        confirms it
  {"known", state, response, reason, stamp, low}
                                        the id is known (not withdrawn); nothing was enqueued, the
                                        sender was only added as a watcher of the outcome; a
                                        "handed" request reads "queued" (not picked up)
  {"full", depth, max_pending, stamp, low}
                                        the endpoint already holds max_pending queued requests;
                                        nothing was written
  {"back", held}                        sent before (ARGV[18]), and the sender's stamp holds
                                        less than ARGV[17] (0: it is gone): Redis lost or
                                        rolled back data since the sender's last step there,
                                        so this may be a replay of an enqueue that ran before
                                        the loss (its record lost with it, and its request
                                        perhaps run already): nothing was written

Invariants:
- a sender's stamp is max(what it held + 1, the clock, the highest stamp carried + 1) after a
  call in which no request carrying it found it low; one that did leaves it as found, so that the sender declares the
  loss and its other steps on their way, carrying the same stamp, find it low too. On one
  server's data it only grows, so it holds less than one the sender was answered only after
  Redis lost or rolled back data
- an enqueue sent before that finds the stamp low writes nothing: sent again after a flush
  took the record its first attempt wrote, it would queue the request afresh, numbered after
  the loss where no fence refuses it, and run it twice if a receiver took it before the loss.
  A first attempt that finds it low is judged as usual (nothing of it can have been written
  before the loss): it is queued after the loss. The sender always carries a stamp (a node
  that knows none fresh writes one first, stamp.lua)
- a known id (queued, taken, answered or cancelled, until its hash expires) is never enqueued
  again, so a replay of this script after a lost reply changes nothing; a withdrawn id (it never
  ran) is enqueued afresh, so a caller may retry a PickupTimeout with the same id, but not by
  a replay of the enqueue that queued it (same sender, same creation time "ct"): withdrawn
  between the two, it stays withdrawn
- a request goes to a parked receiver only if nothing is queued (what waits goes first, in the
  order of _queue.lua) and its park is live by server time; stale parks are
  dropped; a hand-off is recorded in the token's receipt, so a lost pulse loses nothing, and
  one that is not confirmed in time is reclaimed for another receiver (_handoff.lua)
- the hash is written together with its TTL; the queue, counter and park TTLs are refreshed
- the requests of one call are judged in order, each seeing what those before it wrote
  (consecutive ones of one lane are pushed together, before anything reads the queue); the
  endpoint is pulsed once, after the last
- the enqueue counter (KEYS[3]) counts the requests enqueued, for operators; the sequence
  numbers (KEYS[12], _sequence.lua) only grow on one server's data, also when their key expires
  or is flushed (each is at least the server's clock in microseconds): nodes judge rollbacks
  and refuse what a lost Redis still holds by them (prq.node.data_loss)
- a handed-off request is listed in the in-flight set (take.lua does the same for what it takes)
  and in the hand-off set, until it is confirmed or reclaimed
- capacity: no new request while max_pending ids are queued; no hand-off while max_in_flight
  requests are in flight (entries refreshed within the receiver timeout), it is queued instead
- a queued request joins its priority level, in its producer's turn (_queue.lua)
- the request's sequence number "sq" is unique per endpoint (receivers track what they took and
  ran by it); the first new request of a call takes numbers once for itself and every request
  after it in the call, so numbers of requests found known or refused after it go unused (gaps
  are harmless: nothing counts on consecutive numbers)
]]
-- include: _body
-- include: _queue
-- include: _handoff
-- include: _sequence
local GROUP = 18
-- what every request of the call shares, read once: the limits, the server's clock, whether a
-- receiver is parked (read again after a hand-off, which takes or drops parks)
local limits, now, parked = nil, nil, nil
local queued = false
-- sequence numbers: the first new request of a call takes one for itself and each request
-- after it (_sequence.lua), and counts them; `numbered` is the last handed out, `reserved` the
-- last taken, `before` the last the endpoint gave before this call
local numbered, reserved, before = 0, 0, 0
-- ids to push to one lane (priority, producer) not pushed yet: consecutive requests of one
-- lane go in one push, made before anything reads the queue and at the end of the call
local lane = {ids = {}}
-- the sender's stamp as the call found it; whether a request of the call found it low (then
-- it is left as it is), and the highest stamp the call's requests carried
-- the sender stamps the call's requests carry (most often one), by key: what each held, whether
-- a request found it low (it is then left as it is), and the highest stamp carried; in the
-- order first met
local stamps, stamp_keys = {}, {}
-- the requests (by the offset of their values) that found their stamp low
local low = {}

local function flush()
  if #lane.ids > 0 then
    queue_push(KEYS[2], KEYS[9], lane.p, lane.producer, lane.ids, lane.ttl, now, lane.hold)
    lane = {ids = {}}
  end
end

-- the sequence number of the new request whose values start after ARGV[a]
local function next_number(a)
  if numbered == reserved then
    local count = (#ARGV - a) / GROUP
    local first, last = take_numbers(KEYS[12], count, ARGV[a + 7])
    if reserved == 0 then before = last end
    numbered, reserved = first - 1, first + count - 1
    redis.call('INCRBY', KEYS[3], count)
    redis.call('PEXPIRE', KEYS[3], ARGV[a + 7])
  end
  numbered = numbered + 1
  return numbered
end

-- enqueue the request whose record is `key` and whose values start after ARGV[a]
local function enqueue_one(key, stamp_key, a)
  local stamp = stamps[stamp_key]
  if not stamp then
    stamp = {held = tonumber(redis.call('GET', stamp_key) or '0') or 0, low = false, carried = 0}
    stamps[stamp_key] = stamp
    stamp_keys[#stamp_keys + 1] = stamp_key
  end
  local known_stamp = tonumber(ARGV[a + 17]) or 0
  if known_stamp > 0 and stamp.held < known_stamp then
    stamp.low, low[a] = true, true
    if ARGV[a + 18] == '1' then return {'back', stamp.held} end
  end
  stamp.carried = math.max(stamp.carried, known_stamp)
  -- (the hash form: a watcher may join below)
  local known = record_hmget(key, {'st', 'snd', 'w', 'rsp', 'why', 'ct'})
  local state = known[1]
  if state == 'withdrawn' and not (known[2] == ARGV[a + 3] and known[6] == ARGV[a + 4]) then
    -- it never ran and never will: a request sent again with the same id is a fresh one. Not
    -- this very enqueue replayed (the same sender and creation time: its first reply was
    -- lost) after another node withdrew or cancelled it: whoever did was told it never runs
    redis.call('DEL', key)
    state = nil
  end
  if state then
    local snd, watchers, rsp, why = unpack(known, 2, 5)
    if snd ~= ARGV[a + 3] then
      watchers = watchers or ''
      if not string.find(' ' .. watchers .. ' ', ' ' .. ARGV[a + 3] .. ' ', 1, true) then
        redis.call('HSET', key, 'w', watchers .. ' ' .. ARGV[a + 3])
      end
    end
    if state == 'handed' then state = 'queued' end
    return {'known', state, rsp or '', why or ''}
  end

  if not limits then
    local mp, mif = unpack(redis.call('HMGET', KEYS[8], 'mp', 'mif'))
    limits = {limit(mp) or false, limit(mif) or false}
  end
  local max_pending, max_in_flight = limits[1], limits[2]
  if max_pending then
    flush()
    local depth = queue_depth(KEYS[2], KEYS[9])
    if depth >= max_pending then return {'full', depth, max_pending} end
  end

  local counter = next_number(a)

  now = now or server_ms()
  -- the record, queued (a hand-off below makes it 'handed', adding that state's fields)
  local fields = body_fields({'st', 'queued', 'snd', ARGV[a + 3], 'ct', ARGV[a + 4],
    'pd', now + tonumber(ARGV[a + 16]), 'sq', number_text(counter)}, ARGV[a + 2])
  if ARGV[a + 13] ~= '0' then  -- absent reads as priority 0 everywhere
    fields[#fields + 1] = 'pri'
    fields[#fields + 1] = ARGV[a + 13]
  end
  if tonumber(ARGV[a + 15]) > 0 then
    for _, v in ipairs({'ma', ARGV[a + 15], 'pw', ARGV[a + 16], 'pro', ARGV[a + 14]}) do
      fields[#fields + 1] = v
    end
  end
  redis.call('HSET', key, unpack(fields))

  -- while anything waits in the queue, it goes first: parked receivers are woken by the pulse;
  -- and only a parked receiver can be handed the request
  if parked == nil then parked = redis.call('EXISTS', KEYS[4]) == 1 end
  if parked then flush() end
  local handing = parked and redis.call('EXISTS', KEYS[2]) == 0
  if handing and max_in_flight then
    local live = redis.call('ZCOUNT', KEYS[7], now - tonumber(ARGV[a + 12]), '+inf')
    handing = live < max_in_flight
  end
  if handing then
    local k = {hash = key, parked = KEYS[4], parks = KEYS[5], receipt_prefix = KEYS[6],
      run = KEYS[7], handoffs = KEYS[11]}
    local o = {confirm_ms = ARGV[a + 5], in_flight_ttl = ARGV[a + 10], receipt_ttl = ARGV[a + 11],
      list_ttl = ARGV[a + 7], node_prefix = ARGV[a + 9]}
    local handed = hand_off(k, ARGV[a + 1], now, o)
    parked = nil  -- (the hand-off took a park, or dropped those it found stale)
    if handed then return {'handed', counter, before} end
  end

  redis.call('PEXPIRE', key, ARGV[a + 6])
  local p, producer, ttl = ARGV[a + 13], ARGV[a + 14], ARGV[a + 7]
  if lane.p ~= p or lane.producer ~= producer or lane.ttl ~= ttl then
    flush()
    lane.p, lane.producer, lane.ttl = p, producer, ttl
  end
  lane.ids[#lane.ids + 1] = ARGV[a + 1]
  lane.hold = math.max(lane.hold or 0, tonumber(ARGV[a + 6]))
  queued = true
  return {'new', counter, before}
end

local n = #ARGV / GROUP
local replies = {}
for j = 1, n do
  if j == 1 then
    replies[j] = enqueue_one(KEYS[1], KEYS[13], 0)
  else
    replies[j] = enqueue_one(KEYS[10 + 2 * j], KEYS[11 + 2 * j], (j - 1) * GROUP)
  end
end
flush()
local clock = nil
for _, stamp_key in ipairs(stamp_keys) do
  local stamp = stamps[stamp_key]
  stamp.now = stamp.held
  if not stamp.low then
    clock = clock or clock_us()
    stamp.now = math.max(stamp.held + 1, clock, stamp.carried + 1)
    redis.call('SET', stamp_key, number_text(stamp.now), 'PX', ARGV[7])
  end
end
for j = 1, n do
  local reply = replies[j]
  if reply[1] ~= 'back' then
    local stamp = stamps[j == 1 and KEYS[13] or KEYS[11 + 2 * j]]
    reply[#reply + 1] = stamp.now
    reply[#reply + 1] = low[(j - 1) * GROUP] and stamp.held or -1
  end
end
-- only a parked receiver waits for the pulse: one that is not parked is taking or handling,
-- and takes again before it parks (a take parks only while nothing is queued); one pulse for
-- the call
if queued then
  if parked == nil then parked = redis.call('EXISTS', KEYS[4]) == 1 end
  if parked then redis.call('PUBLISH', ARGV[8], '') end
end
if n == 1 then return replies[1] end
return replies
