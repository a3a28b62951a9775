"""The Lua steps: one file per operation, each with a typed call builder and reply parser.

Operations are data. A builder returns a `Call` (the command to send, KEYS and ARGV included);
a parser turns the raw reply into typed values. The async and the blocking queue send the same
calls, so the protocol is written once. Scripts are sent with EVALSHA; the I/O layer loads them
(SCRIPT LOAD) when Redis answers NOSCRIPT, e.g. after a restart.

The `*.lua` files live in this package (package data); the Python modules beside them:
`loading` reads them and keeps the catalog (with their cluster twins), `replies` the reply
shapes several steps share, `redelivery` what the redelivering scripts need to know, and one
module per group of steps: `enqueue` (enqueue, enqueue_many), `take` (take, hand_back,
unpark), `answer` (apply_response), `request_state` (read_response, withdraw, cancel),
`liveness` (beat, presence, canary); `merging` merges enqueues and answers into one call each.
This package's own module imports nothing, so importing one of them loads only what it needs.
"""
