"""A node says once that Redis does not answer, once that it answers again, and again at the
next outage (prq.transport.reachability.Reachability); the URL it names never shows the password."""

from __future__ import annotations

import logging

import pytest

from prq.transport.reachability import Reachability


def test_each_outage_is_said_once_and_its_end_too(caplog: pytest.LogCaptureFixture) -> None:
    reach = Reachability("redis://app:s3cr3t@db:6379/0", 30.0)
    with caplog.at_level(logging.INFO, logger="prq"):
        reach.answered()  # (nothing to say while it answers)
        for _ in range(3):
            reach.failed(ConnectionError("refused"))
        reach.answered()
        reach.answered()
        reach.failed(ConnectionError("refused again"))
    said = [(r.levelno, r.getMessage()) for r in caplog.records]
    assert [level for level, _ in said] == [logging.WARNING, logging.INFO, logging.WARNING]
    assert "does not answer" in said[0][1] and "30 s" in said[0][1] and "refused" in said[0][1]
    assert "answers again" in said[1][1] and "refused again" in said[2][1]
    assert all("s3cr3t" not in message and "db:6379" in message for _, message in said)
