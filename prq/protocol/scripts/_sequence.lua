--[[ _sequence: the sequence numbers an endpoint gives its requests (the last one: prq:{e}:sq).
Scripts include this file where they say `-- include: _sequence`; it is not a script of its own.

A request's sequence number "sq" is at least the server's clock in microseconds (TIME) when it
was enqueued, and above every number the counter gave before: max(last + 1, clock). So on the
data of one server the numbers only grow, whatever happens to the counter key: when it expires
(an endpoint idle for a list TTL), after a flush or a restart empty, the next number is the
clock, above every earlier one. Only a rollback (an old snapshot, a stale replica promoted)
brings back a counter lower than one a node read, and what it still holds is numbered below
the clock of the loss. prq.node.data_loss builds on exactly this: a node's *fence* (a server
time before the loss) is above every request the lost Redis held and below every request
queued since. Numbers run ahead of the clock only while an endpoint is given more than a
million numbers a second.

Numbers are written with string.format('%.0f'): Redis turns a Lua number into a string with 14
significant digits, and a clock in microseconds has 16 (exact in a double until 2255).
]]

-- the server's clock, microseconds since the epoch
local function clock_us()
  local time = redis.call('TIME')
  return tonumber(time[1]) * 1000000 + tonumber(time[2])
end

-- a sequence number (or any integer up to 2^53) as Redis should store it
local function number_text(n)
  return string.format('%.0f', n)
end

-- the counter's value now (0: it has none)
local function counter_value(counter)
  return tonumber(redis.call('GET', counter) or '0') or 0
end

-- take `count` numbers from the counter, which lives `ttl` ms more: the first of them, and the
-- counter's value before (0: none)
local function take_numbers(counter, count, ttl)
  local last = counter_value(counter)
  local first = math.max(last + 1, clock_us())
  redis.call('SET', counter, number_text(first + count - 1), 'PX', ttl)
  return first, last
end
