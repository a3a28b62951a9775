"""Bearer-token auth: an admin role and a read-only role.

A presented token is compared with every configured token, each time, in constant time
(`hmac.compare_digest` over SHA-256 digests, so neither the length nor the position of a match
shows in the timing). No token → 401 with `WWW-Authenticate: Bearer`; a read token on a route
that changes something → 403. Tokens are never logged or echoed.
"""

from __future__ import annotations

import enum
import hashlib
import hmac
import logging
from collections.abc import Iterable
from typing import Annotated

from fastapi import Depends, HTTPException, Request, status
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from pydantic import SecretStr

__all__ = ["Role", "TokenChecker", "require_admin", "require_read"]

logger = logging.getLogger(__name__)


class Role(enum.StrEnum):
    """What a token may do: `admin` reads and acts, `read` only reads."""

    ADMIN = "admin"
    READ = "read"


def _digest(token: str) -> bytes:
    return hashlib.sha256(token.encode("utf-8")).digest()


class TokenChecker:
    """Maps a presented bearer token to its role, in constant time over every known token."""

    __slots__ = ("_tokens",)

    def __init__(self, admin_tokens: Iterable[SecretStr], read_tokens: Iterable[SecretStr]) -> None:
        self._tokens: tuple[tuple[bytes, Role], ...] = (
            *((_digest(t.get_secret_value()), Role.ADMIN) for t in admin_tokens),
            *((_digest(t.get_secret_value()), Role.READ) for t in read_tokens),
        )

    def __repr__(self) -> str:
        return f"TokenChecker(tokens={len(self._tokens)})"

    def role_of(self, presented: str) -> Role | None:
        """The role of `presented`, or None; every token is compared, match or not."""
        digest = _digest(presented)
        found: Role | None = None
        for token, role in self._tokens:
            # No early exit: the loop takes as long whichever token (if any) matches.
            if hmac.compare_digest(digest, token) and found is None:
                found = role
        return found


#: Reads `Authorization: Bearer ...`; declares the scheme in the OpenAPI document.
bearer_scheme = HTTPBearer(
    auto_error=False,
    scheme_name="BearerToken",
    description="An admin or read token from PRQ_API_ADMIN_TOKENS / PRQ_API_READ_TOKENS.",
)


def _unauthorized() -> HTTPException:
    return HTTPException(
        status_code=status.HTTP_401_UNAUTHORIZED,
        detail="a valid bearer token is required (Authorization: Bearer <token>)",
        headers={"WWW-Authenticate": "Bearer"},
    )


async def require_read(
    request: Request,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer_scheme)],
) -> Role:
    """Any valid token (admin or read); its role. 401 otherwise."""
    checker: TokenChecker = request.app.state.token_checker
    if credentials is None:
        raise _unauthorized()
    role = checker.role_of(credentials.credentials)
    if role is None:
        client = request.client.host if request.client else "?"
        logger.info("rejected bearer token client=%s path=%s", client, request.url.path)
        raise _unauthorized()
    return role


async def require_admin(role: Annotated[Role, Depends(require_read)]) -> Role:
    """An admin token; 403 for a read token, 401 without a valid one."""
    if role is not Role.ADMIN:
        raise HTTPException(
            status_code=status.HTTP_403_FORBIDDEN,
            detail="this action needs an admin token; the token given is read-only",
        )
    return role
