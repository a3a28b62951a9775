"""Names and ids: what an endpoint name and a request id may be, and the ids prq makes.

An endpoint name is checked before anything is written (`validate_endpoint`) and read back
leniently (`readable_endpoint`); a request id matches REQUEST_ID_PATTERN. This module is below
the models (they check their fields with it) and imports nothing of prq but its errors.
"""

from __future__ import annotations

import os
import string

from prq.core.errors import InvalidEndpoint

__all__ = [
    "COMPACT_ID_LENGTH",
    "MAX_ENDPOINT_LENGTH",
    "REQUEST_ID_PATTERN",
    "new_request_id",
    "readable_endpoint",
    "validate_endpoint",
]

#: Longest endpoint name accepted (characters); longer names are rejected, never truncated.
MAX_ENDPOINT_LENGTH = 200
#: Request ids: what a uuid4, a uuid5 or a caller's own stable key looks like. No `|`, which
#: separates fields in pulses, and nothing that needs escaping in a key.
REQUEST_ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.:\-]{0,127}$"


def validate_endpoint(endpoint: object) -> str:
    """Return `endpoint` if it is a valid name for new work, else raise InvalidEndpoint.

    A valid name is 1-200 printable characters (`str.isprintable`: no control characters,
    line breaks or tabs) that neither start nor end with whitespace. prq does not parse it:
    `poll://billing-7`, `billing-7` and `poll://` are three different, valid names (the scheme
    is a convention). Names already in Redis are read with the looser `readable_endpoint`."""
    endpoint = readable_endpoint(endpoint)
    if endpoint != endpoint.strip():
        raise InvalidEndpoint(
            f"endpoint {endpoint!r} starts or ends with whitespace; a name that differs only "
            "in its spaces would be another endpoint: remove them"
        )
    return endpoint


def readable_endpoint(endpoint: object) -> str:
    """Return `endpoint` if it is 1-200 printable characters, else raise InvalidEndpoint: what
    earlier versions took for a name, so names they left in Redis (e.g. with a leading space)
    can still be read, shown and forgotten, while new work is refused them
    (`validate_endpoint`)."""
    if not isinstance(endpoint, str):
        raise InvalidEndpoint(f"endpoint must be a string, not {type(endpoint).__name__}")
    if not 1 <= len(endpoint) <= MAX_ENDPOINT_LENGTH:
        raise InvalidEndpoint(
            f"endpoint must be 1-{MAX_ENDPOINT_LENGTH} characters, got {len(endpoint)}"
        )
    if not endpoint.isprintable():
        bad = next(c for c in endpoint if not c.isprintable())
        raise InvalidEndpoint(
            f"endpoint {endpoint!r} has a non-printable character {bad!r}; "
            "use printable characters only"
        )
    return endpoint


#: The alphabet of the ids prq makes: letters and digits only, so an id is URL-safe, needs no
#: escaping in a key or a log line, and starts with a letter or digit (REQUEST_ID_PATTERN).
_ID_ALPHABET = string.digits + string.ascii_uppercase + string.ascii_lowercase
#: Characters of an id prq makes: 22 random ones of 62 hold about 131 bits, more than a uuid4.
COMPACT_ID_LENGTH = 22
#: Random byte -> id character (byte % 62: the first 8 characters come 5 times in 256, the
#: others 4 times, which costs each character 0.004 of its 5.95 bits).
_ID_TABLE = bytes(ord(_ID_ALPHABET[b % len(_ID_ALPHABET)]) for b in range(256))


def new_request_id() -> str:
    """A fresh random request id: 22 letters and digits from the OS's random source (one
    urandom call and one table lookup per character: a call makes one, so it stays cheap)."""
    return os.urandom(COMPACT_ID_LENGTH).translate(_ID_TABLE).decode("ascii")
