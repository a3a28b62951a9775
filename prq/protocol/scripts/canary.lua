--[[ canary: step this node's data-loss canary, once per check, replay-safe.

KEYS[1]  the node's canary     prq:canary:{<node>}
ARGV[1]  TTL, ms
ARGV[2]  the value the node expects it to hold (0: none); -1: none known, write ARGV[3] anyway
ARGV[3]  the value to write when it holds what is expected: the expected one + 1, or after a
         surprise a fresh one the node drew at random (so that no value repeats, and no
         canary that Redis may bring back from an older state of its data has it)

Reply: {value, clock}: the canary's value after this call, and the server's clock then
(microseconds, the clock sequence numbers follow: _sequence.lua). The node expects ARGV[3];
anything else means Redis lost data (0: the canary is gone, after a restart or a flush) or
rolled back (another value: a restore from a snapshot, a failover to a stale replica), and
everything Redis holds now was there before the clock of the last step the node judged
(prq.node.data_loss: its fence).

Invariants:
- the canary moves only from what is expected to ARGV[3], so a replay of the same check (a retry
  after a lost reply) replies the same instead of stepping twice
- value and TTL are written together
]]
-- include: _sequence
local current = tonumber(redis.call('GET', KEYS[1]) or '0')
local expected, following = tonumber(ARGV[2]), tonumber(ARGV[3])
if expected < 0 or current == expected then
  current = following
  redis.call('SET', KEYS[1], number_text(current), 'PX', ARGV[1])
elseif current == following then
  redis.call('PEXPIRE', KEYS[1], ARGV[1])
end
return {current, clock_us()}
