"""prq's admin service (FastAPI): health, endpoints, requests, metrics, dashboard.

Not in this version yet: the package is reserved so that `api/` is importable and type-checked.
"""
