"""The retry policy (prq.transport.budgets.StepBudgets) on a fake clock: a step is given up no
sooner than its budget and no later than the attempt that crosses it, each step of a batch on its
own budget. Driven by tenacity's Retrying as the I/O layers drive it, with its sleep injected."""

from __future__ import annotations

import pytest
import redis
from hypothesis import given
from hypothesis import strategies as st
from redis.exceptions import AskError, MovedError, TryAgainError
from tenacity import Retrying

from prq.core.errors import PrqError, QueueUnavailable
from prq.protocol.effects import Call, Reply, Resend
from prq.transport.budgets import DEFAULT_RETRY_MAX_S, StepBudgets
from prq.transport.translate import RedisUnavailable, translate_errors

#: What one attempt costs on the fake clock (a refused connection, say), unless a test says.
ATTEMPT_S = 0.001


class FakeClock:
    """Time that moves only when the policy sleeps or an attempt is made."""

    def __init__(self) -> None:
        self.now = 0.0
        self.sleeps: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(float(seconds))
        self.now += seconds


class Run:
    """Steps retried under StepBudgets until each is settled; when and how each one ended."""

    def __init__(self, asked: list[float], budget_s: float) -> None:
        self.clock = FakeClock()
        self.steps = [(Call(("GET", f"k{i}")),) for i in range(len(asked))]
        self.settled: dict[int, tuple[float, list[Reply] | PrqError]] = {}
        self.sent: list[list[Call]] = []
        self.started: list[float] = []
        self.budgets = StepBudgets(self.steps, asked, budget_s, self._settle, clock=self.clock)

    def _settle(self, index: int, outcome: list[Reply] | PrqError) -> None:
        assert index not in self.settled, f"step {index} settled twice"
        self.settled[index] = (self.clock.now, outcome)

    def until(self, answers_from: float = float("inf"), attempt_s: float = ATTEMPT_S) -> None:
        """Attempt (each costing `attempt_s`) until every step is settled: attempts that end
        before `answers_from` fail with a connection error, later ones are answered."""
        retrying = Retrying(sleep=self.clock.sleep, **self.budgets.retrying())
        try:
            for attempt in retrying:
                with attempt:
                    calls = self.budgets.calls()
                    self.sent.append(calls)
                    self.started.append(self.clock.now)
                    self.clock.now += attempt_s
                    if self.clock.now < answers_from:
                        raise RedisUnavailable("connection refused")
                    self.budgets.answered([b"v"] * len(calls))
        except RedisUnavailable:  # the policy stopped: what it did not settle fails now
            self.budgets.give_up(QueueUnavailable("stopped with the step unsettled"))
        assert len(self.settled) == len(self.steps)


@given(
    budget_s=st.floats(0.0, 5.0),
    attempt_s=st.floats(0.0005, 0.05),
    asked=st.lists(st.floats(0.0, 2.0), min_size=1, max_size=5),
)
def test_every_step_is_given_up_at_its_budget_never_sooner(
    budget_s: float, attempt_s: float, asked: list[float]
) -> None:
    # Given steps asked at different times (one batch), and a Redis that never answers
    run = Run(asked, budget_s)
    sent_at = run.clock.now = max(asked)  # the batch is sent once its newest step was asked
    # When they are retried until the policy gives up
    run.until(attempt_s=attempt_s)
    # Then each step failed with QueueUnavailable once its own budget was spent, and no later
    # than the attempt that crossed it
    for i, at in enumerate(asked):
        ended, outcome = run.settled[i]
        assert isinstance(outcome, QueueUnavailable)
        deadline = at + budget_s
        assert ended >= deadline, (i, ended, deadline)
        assert ended <= max(deadline, sent_at) + attempt_s + 1e-9, (i, ended, deadline)
    # And no backoff was longer than the longest the policy allows
    assert all(0.0 <= s <= DEFAULT_RETRY_MAX_S for s in run.clock.sleeps)


def test_the_last_backoff_is_cut_short_to_end_when_the_budget_does() -> None:
    # Given one step with a 2 s budget, against a Redis that never answers
    run = Run([0.0], 2.0)
    # When it is retried until given up
    run.until()
    # Then its last attempt started exactly when the budget ended (the sleep before it was cut
    # to what remained), and it failed right after that attempt
    ended, outcome = run.settled[0]
    assert isinstance(outcome, QueueUnavailable)
    assert ended == pytest.approx(2.0 + ATTEMPT_S)
    assert run.clock.now - ATTEMPT_S == pytest.approx(2.0)
    assert len(run.sent) > 2


def test_each_step_of_a_batch_keeps_its_own_budget() -> None:
    # Given a batch of two steps, asked at 0 s and at 0.3 s, with 1 s budgets
    run = Run([0.0, 0.3], 1.0)
    run.clock.now = 0.3
    # When Redis never answers
    run.until()
    # Then the first is given up at 1 s and the second at 1.3 s, each after its full budget
    assert run.settled[0][0] == pytest.approx(1.0 + ATTEMPT_S)
    assert run.settled[1][0] == pytest.approx(1.3 + ATTEMPT_S)
    # And once the first was given up, attempts carried only the second step's calls
    after = [calls for calls in run.sent if calls != [*run.steps[0], *run.steps[1]]]
    assert after and all(calls == list(run.steps[1]) for calls in after)


def test_a_step_answered_within_its_budget_gets_its_replies() -> None:
    # Given a step with a 1 s budget and a Redis that answers again after 0.4 s
    run = Run([0.0], 1.0)
    # When it is retried
    run.until(answers_from=0.4)
    # Then it ends with its replies as soon as an attempt gets through: the first attempt
    # started after Redis came back (the jittered backoff may put it at the budget's very end,
    # never past it)
    ended, outcome = run.settled[0]
    assert outcome == [b"v"]
    assert [t >= 0.4 - ATTEMPT_S for t in run.started] == [False] * (len(run.started) - 1) + [True]
    assert 0.4 <= ended <= 1.0 + ATTEMPT_S


def test_a_zero_budget_gives_one_attempt() -> None:
    run = Run([0.0], 0.0)
    run.until()
    assert len(run.sent) == 1 and isinstance(run.settled[0][1], QueueUnavailable)


def test_a_sender_whose_own_step_is_settled_stops_and_leaves_the_rest_unsettled() -> None:
    # Given a batch of two steps (asked at 0 s and 0.3 s, 1 s budgets) sent by the thread that
    # asked the first: it retries for the batch only while its own step is in it
    run = Run([0.0, 0.3], 1.0)
    own_done = lambda: 0 in run.settled  # noqa: E731
    run.budgets = StepBudgets(
        run.steps, [0.0, 0.3], 1.0, run._settle, clock=run.clock, hand_over=own_done
    )
    run.clock.now = 0.3
    # When Redis never answers
    retrying = Retrying(sleep=run.clock.sleep, **run.budgets.retrying())
    with pytest.raises(RedisUnavailable):
        for attempt in retrying:
            with attempt:
                run.clock.now += ATTEMPT_S
                raise RedisUnavailable("connection refused")
    # Then its own step was given up after its budget, and the attempts stopped right there:
    # the second step is still live, unsettled, its budget still counting, for another sender
    assert run.settled[0][0] == pytest.approx(1.0 + ATTEMPT_S)
    assert run.clock.now == pytest.approx(1.0 + ATTEMPT_S)
    assert 1 not in run.settled and run.budgets.live == [1] and run.budgets.handing_over()
    assert run.budgets.remaining_s() == pytest.approx(0.3 - ATTEMPT_S)


def test_a_step_whose_node_was_not_reached_is_retried_alone_the_others_settle() -> None:
    # Given three steps in one round trip on a cluster, the second one's node down (its reply
    # is that node's connection error, in place) and an error reply for the third
    run = Run([0.0, 0.0, 0.0], 1.0)
    refused = redis.ConnectionError("Error 111 connecting to 127.0.0.1:7001")
    # When the round trip's replies come back
    with pytest.raises(RedisUnavailable, match="Error 111"):
        run.budgets.answered([b"v", refused, redis.ResponseError("WRONGTYPE")])
    # Then the first two are settled with their replies and error, and only the one whose
    # node was not reached stays live, to be sent again
    assert run.settled[0][1] == [b"v"]
    assert isinstance(run.settled[2][1], PrqError) and "WRONGTYPE" in str(run.settled[2][1])
    assert run.budgets.live == [1] and run.budgets.calls() == [run.steps[1][0]]
    # And when it is sent again and answered, it ends with its replies
    run.budgets.answered([b"w"])
    assert run.settled[1][1] == [b"w"] and run.budgets.live == []


@pytest.mark.parametrize(
    "raised",
    [
        TryAgainError("Multiple keys request during rehashing of slot"),
        MovedError("6978 127.0.0.1:7001"),
        AskError("6978 127.0.0.1:7001"),
    ],
)
def test_a_redirection_raised_by_the_client_is_retried_not_taken_for_a_refusal(
    raised: Exception,
) -> None:
    # A cluster node that did not run a command (TRYAGAIN while its slot moves, MOVED, ASK)
    # and whose redirection redis-py gave up following raises: the command never ran, so the
    # retry policy tries it again rather than failing the call as refused (prq.PrqError)
    with pytest.raises(RedisUnavailable), translate_errors():
        raise raised
    # ...while a refusal stays one
    with pytest.raises(PrqError, match="refused"), translate_errors():
        raise redis.ResponseError("ERR unknown command")


def test_a_call_with_a_resend_goes_as_it_is_first_then_as_its_resend_on_every_attempt() -> None:
    # (an enqueue sent again may be a replay of one a data loss undid: enqueue.lua is told so)
    again = Call(("EVAL", "again"))
    first = Call(("EVAL", "first"), resend=Resend(again))
    plain = Call(("PING",))
    budgets = StepBudgets([[first], [plain]], [0.0, 0.0], 5.0, lambda i, r: None)
    assert budgets.calls() == [first, plain]
    assert budgets.calls() == [again, plain]
    # (a step handed over to another sender keeps what it was: the resend lives on the call)
    handed_over = StepBudgets([[first]], [0.0], 5.0, lambda i, r: None)
    assert handed_over.calls() == [again]
