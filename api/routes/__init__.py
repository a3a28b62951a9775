"""The admin service's routes, one router per area.

- `health`: `/health` (no auth) and `/api/whoami`.
- `endpoints`: what Redis holds per endpoint: `/api/endpoints`, `/api/endpoint`, `/api/queued`,
  `/api/throughput`.
- `limits`: an endpoint's capacity limits: `GET` / `PUT /api/endpoint/limits?endpoint=`.
- `dead_letters`: an endpoint's dead letters: `GET /api/dead-letters?endpoint=`, and
  `POST /api/dead-letters/replay` / `purge` (admin).
- `requests`: one request by id: `/api/requests/{request_id}` and its `cancel`.
- `metrics`: Prometheus `/metrics`.
- `dashboard`: the HTML dashboard shell and its packaged assets (not in the OpenAPI document).

Endpoint names travel in the `endpoint` query parameter, never in the path: they contain `/`.
"""
