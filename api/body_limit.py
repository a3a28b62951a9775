"""Request body size limit, as a pure ASGI middleware.

A declared `Content-Length` over the limit is refused before any byte of the body is read. A
body without one (chunked) is read here, counting bytes, and refused as soon as it passes the
limit; a body within the limit is handed to the app unchanged. Either way the app never sees
more than `max_body_bytes`, whether or not its route reads the body. Refusals are 413 with the
service's JSON error body.
"""

from __future__ import annotations

import json

from starlette.types import ASGIApp, Message, Receive, Scope, Send

__all__ = ["BodySizeLimit"]


def _content_length(scope: Scope) -> int | None:
    """The declared length; None when absent; -1 when it is not a valid number."""
    for name, value in scope.get("headers", ()):
        if name == b"content-length":
            try:
                length = int(value)
            except ValueError:
                return -1
            return length if length >= 0 else -1
    return None


class BodySizeLimit:
    """Refuse request bodies over `max_body_bytes` with 413."""

    def __init__(self, app: ASGIApp, max_body_bytes: int) -> None:
        self.app = app
        self.max_body_bytes = max_body_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = _content_length(scope)
        if declared == -1:
            await self._refuse(send, 400, "bad_request", "the Content-Length header is not valid")
            return
        if declared is not None and declared > self.max_body_bytes:
            await self._refuse_too_large(send)
            return
        # Read the body now (it is small by construction) so the limit holds for every route.
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] != "http.request":
                # The client went away before sending its body: nothing to answer.
                return
            chunk: bytes = message.get("body", b"")
            size += len(chunk)
            if size > self.max_body_bytes:
                await self._refuse_too_large(send)
                return
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        await self.app(scope, _replay(b"".join(chunks), receive), send)

    async def _refuse_too_large(self, send: Send) -> None:
        await self._refuse(
            send,
            413,
            "payload_too_large",
            f"the request body is over the limit of {self.max_body_bytes} bytes",
        )

    @staticmethod
    async def _refuse(send: Send, status: int, error_type: str, message: str) -> None:
        body = json.dumps({"error": {"type": error_type, "message": message}}).encode()
        await send(
            {
                "type": "http.response.start",
                "status": status,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(body)).encode()),
                    # The rest of the body is not read: the connection cannot be reused.
                    (b"connection", b"close"),
                ],
            }
        )
        await send({"type": "http.response.body", "body": body})


def _replay(body: bytes, receive: Receive) -> Receive:
    """A `receive` that hands out `body` once, then defers to the server (disconnects)."""
    sent = False

    async def replay() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay
