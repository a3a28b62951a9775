"""The protocol, written once: each operation is a generator of effects (sans I/O).

A flow yields `Exec` (send these calls in one round trip; receive the replies), `Wait` (wait
for a pulse signal or a timeout) and `Offload` (blocking file I/O: reading back a body kept
beside Redis, prq.core.bodies), and returns its result. `AsyncQueue` drives flows with
`await`, `Queue` drives the same flows with blocking calls; nothing else differs between them.

Sender life of one call (`call_flow`):

    enqueue ─▶ wait(pulse | poll) ─▶ response in pulse? ─yes─▶ done
                    ▲                       │ no
                    └── queued/taken ◀── read_response ─▶ done / withdrawn / missing
    queued past the pickup deadline ─▶ withdraw ─▶ PickupTimeout (or, if taken meanwhile, wait on)

The modules: `context` (what every flow is given), `call` (the caller's call_flow), `receiver`
(take_flow, respond_flow), `cancel` (withdraw and cancel), `status` (status_flow), `registry`
(the endpoint registry, locators, locate_flow) and `layout` (an endpoint's first-use check).
This package's own module imports nothing.
"""
