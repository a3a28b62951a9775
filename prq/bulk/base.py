"""A bulk client's state and connection (BulkBase): its settings, key schema, owned Redis I/O,
signer and DataStream keeper, shared by the mixins that make BulkClient (prq.bulk.encode,
prq.bulk.send, prq.bulk.outcomes)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Self, TypeVar

from prq.core.config import QueueSettings, RedisSettings
from prq.core.errors import PrqError
from prq.core.keys import KeySchema
from prq.protocol.effects import Exec, Flow
from prq.protocol.signing import Signer
from prq.protocol.stream_keeper import StreamKeeper
from prq.transport.sync_io import SyncRedisIO
from prq.transport.topology import is_cluster_url

if TYPE_CHECKING:
    from prq.datastreams import DataStreamStore

__all__ = ["BulkBase"]

T = TypeVar("T")


class BulkBase:
    """The state a BulkClient's parts share, and its connection's life."""

    def __init__(
        self,
        redis_settings: RedisSettings,
        *,
        prefix: str = "prq",
        settings: QueueSettings | None = None,
        datastreams: DataStreamStore | None = None,
    ) -> None:
        self.settings = settings or QueueSettings()
        self.redis_settings = redis_settings
        self.keys = KeySchema(prefix, sharded=is_cluster_url(redis_settings.url))
        self._io = SyncRedisIO(redis_settings, self.settings)
        #: Endpoints checked for the previous layout's lanes (flows.layout_flow), once each.
        self._layout_checked: set[str] = set()
        #: Signs the requests and checks the responses (None: no signing key; prq.protocol.signing).
        self.signer = Signer.from_settings(self.settings)
        #: Keeps bodies over inline_limit_bytes beside Redis, and reads them back (prq.core.bodies).
        self.streams = StreamKeeper(datastreams, self.settings)

    @classmethod
    def from_url(
        cls,
        url: str | None = None,
        *,
        prefix: str = "prq",
        settings: QueueSettings | None = None,
        datastreams: DataStreamStore | None = None,
        redis_settings: RedisSettings | None = None,
    ) -> Self:
        """A client for `url` (else `PRQ_REDIS_URL`, or `redis_settings.url`), with the
        connection settings of `redis_settings` (a `url` given beside them replaces theirs)."""
        redis = RedisSettings.from_url(url) if redis_settings is None else redis_settings
        return cls(redis.with_url(url), prefix=prefix, settings=settings, datastreams=datastreams)

    def _run(self, flow: Flow[T]) -> T:
        """Drive `flow` (its effects are round trips, `Exec`) on this client's connection: a
        round trip's error (prq's) is thrown into the flow where it waits, which may say more
        of it; any other error ends the flow. The simulation drives the same flows with its
        own scheduler (tests/sim)."""
        replies: object = None
        error: PrqError | None = None
        while True:
            try:
                effect = flow.throw(error) if error is not None else flow.send(replies)
            except StopIteration as stop:
                return stop.value  # type: ignore[no-any-return]
            error = None
            if not isinstance(effect, Exec):
                flow.close()
                raise TypeError(f"a bulk flow yields round trips only, not {effect!r}")
            try:
                replies = self._io.execute(effect.calls)
            except PrqError as exc:
                error = exc
            except BaseException:
                flow.close()
                raise

    def close(self) -> None:
        self._io.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
