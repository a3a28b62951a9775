"""A wrong Redis URL: what is malformed or refused by the server is a ConfigurationError at
once (not after the retry budget); a Redis that does not answer is retried within the budget,
and the node says so once, in one log line, instead of staying silent."""

from __future__ import annotations

import logging
import time

import pytest

from prq import ConfigurationError, QueueUnavailable
from prq.embedded import EmbeddedRedis, free_port
from tests.queue_facades import QueueFactory

pytestmark = pytest.mark.integration

#: A retry budget far longer than the test may take: an error "at once" cannot be its end.
LONG_BUDGET_S = 60.0


async def test_a_database_the_server_does_not_have_is_refused_at_once(
    make_queue: QueueFactory, own_redis: EmbeddedRedis
) -> None:
    # Given a node whose URL names database 99 of a server that has 16
    queue = make_queue(url=f"redis://127.0.0.1:{own_redis.port}/99", retry_budget_s=LONG_BUDGET_S)

    # When it sends, Then it fails with ConfigurationError long before the retry budget ends
    started = time.monotonic()
    with pytest.raises(ConfigurationError, match="database"):
        await queue.notify("poll://wrong-db", "m")
    assert time.monotonic() - started < LONG_BUDGET_S / 4


@pytest.mark.parametrize("url", ["http://127.0.0.1:6379/0", "127.0.0.1:6379", "redis://h:x/0"])
async def test_a_url_that_is_no_redis_url_is_refused_when_the_node_is_made(
    make_queue: QueueFactory, url: str
) -> None:
    with pytest.raises(ConfigurationError):
        make_queue(url=url)


async def test_a_redis_that_does_not_answer_is_retried_and_said_once(
    make_queue: QueueFactory, caplog: pytest.LogCaptureFixture
) -> None:
    # Given a node whose URL names a port nothing listens on, and a short retry budget
    queue = make_queue(url=f"redis://127.0.0.1:{free_port()}/0", retry_budget_s=1.0)

    # When it sends
    with caplog.at_level(logging.INFO, logger="prq"), pytest.raises(QueueUnavailable):
        await queue.notify("poll://nobody-home", "m")

    # Then the call failed after its retries, and the node said once that Redis does not answer
    said = [r for r in caplog.records if "does not answer" in r.getMessage()]
    assert len(said) == 1 and said[0].levelno == logging.WARNING
    assert "127.0.0.1" in said[0].getMessage()
