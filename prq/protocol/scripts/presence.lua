--[[ presence: a receiver node says it serves an endpoint, on Redis's clock.

KEYS[1]  receivers             prq:{e}:rcv      (zset: node -> last seen, server ms)
ARGV[1]  node id
ARGV[2]  drop entries not seen for this long, ms (long-dead nodes)
ARGV[3]  TTL of the set, ms

Reply: the server time written, ms

Invariants:
- scores are server time (TIME), the one clock every node and the admin view share, so a node
  whose clock is off is still judged live or dead correctly
- replaying it only moves the node's score forward; the set stays bounded by the live nodes
]]
local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
redis.call('ZADD', KEYS[1], now, ARGV[1])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now - tonumber(ARGV[2]))
redis.call('PEXPIRE', KEYS[1], ARGV[3])
return now
