"""Delivery identity: the hash a handler can dedupe its side effects on.

Invariant: a request's delivery hash depends only on its endpoint and id, so it is the same on
every attempt and on every node.
"""

from __future__ import annotations

import hashlib

__all__ = ["delivery_hash"]


def delivery_hash(endpoint: str, request_id: str) -> str:
    """A stable hex hash naming one request's delivery, the same on every attempt."""
    return hashlib.sha256(f"{endpoint}\n{request_id}".encode()).hexdigest()[:32]
