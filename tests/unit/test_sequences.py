"""Stateful sequence bookkeeping (``ferry.scheduling.sequences``) with an injected clock:
no workers, no sockets, no sleeps. ``asyncio.sleep(0)`` only yields to the loop so the
done callbacks of answered jobs (scheduled with ``call_soon``) run."""

from __future__ import annotations

import asyncio
import itertools
import uuid
from collections.abc import Awaitable, Callable

import pytest

from ferry.errors import HandlerFailed, Overloaded, SequenceEnded
from ferry.handlers.contract.context import (
    SEQUENCE_END_HEADER,
    SEQUENCE_ID_HEADER,
    SEQUENCE_START_HEADER,
)
from ferry.scheduling.jobs import Job, Prediction
from ferry.scheduling.sequences import (
    SequenceBook,
    SequenceLane,
    SequenceSettings,
    asks_to_end,
    ended_by,
    sequence_of,
)
from ferry.wire.messages import InputPart, RequestItem

BOUND = 5.0
"""Seconds a scenario may take before it fails instead of hanging (a guard, not a timing)."""

_ids = itertools.count(1)


class Clock:
    """The book's clock: a float the test sets."""

    def __init__(self, now: float = 0.0) -> None:
        self.now = now


def run(scenario: Callable[[], Awaitable[None]]) -> None:
    asyncio.run(asyncio.wait_for(scenario(), BOUND))


async def settle() -> None:
    """Let the done callbacks of the futures just answered run."""
    await asyncio.sleep(0)


def make_job(name: str = "", enqueued_at: float = 0.0) -> Job:
    """A job for the running loop, stamped with ``enqueued_at`` from the fake clock."""
    item = RequestItem(name or f"j{next(_ids)}", {}, [InputPart("body", "text/plain", b"x")])
    future: asyncio.Future[Prediction] = asyncio.get_running_loop().create_future()
    return Job(item, future, enqueued_at=enqueued_at)


def answer(job: Job, headers: dict[str, str] | None = None) -> None:
    job.resolve(Prediction(b"ok", "text/plain", 200, headers or {}))


def make_book(
    clock: Clock,
    *,
    max_sequences: int = 4,
    queue_size: int = 4,
    max_idle: float = 10.0,
    timeout: float | None = None,
    batch_size: int = 4,
    max_delay: float = 0.0,
    wait_for_more: bool = False,
) -> SequenceBook:
    return SequenceBook(
        SequenceSettings(max_sequences, queue_size, max_idle, timeout),
        batch_size,
        max_delay,
        lambda: clock.now,
        wait_for_more=wait_for_more,
    )


def ended_error(job: Job) -> BaseException | None:
    assert job.future.done()
    return job.future.exception()


# --- header helpers ----------------------------------------------------------------------


def test_sequence_of_keeps_a_given_id_and_copies_the_headers() -> None:
    headers = {SEQUENCE_ID_HEADER: "s1", "x-other": "y"}
    sequence_id, seen = sequence_of(headers)
    assert sequence_id == "s1"
    assert seen == {SEQUENCE_ID_HEADER: "s1", "x-other": "y"}
    assert seen is not headers
    seen["x-other"] = "changed"
    assert headers["x-other"] == "y"


@pytest.mark.parametrize("headers", [{"x-other": "y"}, {SEQUENCE_ID_HEADER: "", "x-other": "y"}])
def test_sequence_of_names_a_new_sequence_and_marks_its_start(headers: dict[str, str]) -> None:
    before = dict(headers)
    sequence_id, seen = sequence_of(headers)
    assert sequence_id.startswith("ts-seq-")
    minted = sequence_id.removeprefix("ts-seq-")
    assert str(uuid.UUID(minted)) == minted
    assert seen == {"x-other": "y", SEQUENCE_ID_HEADER: sequence_id, SEQUENCE_START_HEADER: "true"}
    assert headers == before
    assert sequence_of(headers)[0] != sequence_id


@pytest.mark.parametrize(
    ("value", "expected"),
    [("true", True), ("True", True), (" TRUE ", True), ("false", False), ("", False), ("1", False)],
)
def test_asks_to_end(value: str, expected: bool) -> None:
    assert asks_to_end({SEQUENCE_END_HEADER: value}) is expected


def test_asks_to_end_without_the_header() -> None:
    assert asks_to_end({"x-other": "true"}) is False


@pytest.mark.parametrize(
    ("value", "expected"),
    [("a; b;", ["a", "b"]), ("a", ["a"]), (" ;; ", []), ("", []), ("a;b", ["a", "b"])],
)
def test_ended_by(value: str, expected: list[str]) -> None:
    assert ended_by({SEQUENCE_END_HEADER: value}) == expected


def test_ended_by_without_the_header() -> None:
    assert ended_by({"x-other": "a"}) == []


# --- requests in ---------------------------------------------------------------------------


def test_add_opens_a_sequence_and_queues_in_it() -> None:
    async def scenario() -> None:
        book = make_book(Clock())
        first, second, other = make_job(), make_job(), make_job()
        book.add(first, "s1")
        assert (book.open_sequences, len(book)) == (1, 1)
        assert first.sequence_id == "s1"
        book.add(second, "s1")
        assert (book.open_sequences, len(book)) == (1, 2)
        book.add(other, "s2")
        assert (book.open_sequences, len(book)) == (2, 3)
        assert other.sequence_id == "s2"

    run(scenario)


def test_add_past_max_sequences_is_overloaded() -> None:
    async def scenario() -> None:
        book = make_book(Clock(), max_sequences=2)
        book.add(make_job(), "s1")
        book.add(make_job(), "s2")
        refused = make_job()
        with pytest.raises(Overloaded, match=r"2 sequences are open.*\(maxNumSequence\)"):
            book.add(refused, "s3")
        assert refused.sequence_id is None
        assert (book.open_sequences, len(book)) == (2, 2)
        book.add(make_job(), "s1")  # an open sequence still takes requests
        assert (book.open_sequences, len(book)) == (2, 3)

    run(scenario)


def test_add_past_the_sequence_queue_size_is_overloaded() -> None:
    async def scenario() -> None:
        book = make_book(Clock(), queue_size=2)
        book.add(make_job(), "s1")
        book.add(make_job(), "s1")
        refused = make_job()
        with pytest.raises(
            Overloaded, match=r"sequence s1 has 2 requests waiting.*\(maxSequenceJobQueueSize\)"
        ):
            book.add(refused, "s1")
        assert refused.sequence_id is None
        assert len(book) == 2
        book.add(make_job(), "s2")  # the limit is per sequence
        assert len(book) == 3

    run(scenario)


def test_add_behind_a_last_request_is_refused() -> None:
    async def scenario() -> None:
        book = make_book(Clock())
        book.add(make_job(), "s1", last=True)
        with pytest.raises(SequenceEnded, match=f"sequence s1 is ending.*{SEQUENCE_END_HEADER}"):
            book.add(make_job(), "s1")
        assert (book.open_sequences, len(book)) == (1, 1)
        book.add(make_job(), "s2")
        assert (book.open_sequences, len(book)) == (2, 2)

    run(scenario)


# --- taking batches ------------------------------------------------------------------------


def test_take_takes_one_request_per_sequence_up_to_the_batch_size() -> None:
    async def scenario() -> None:
        book = make_book(Clock(), batch_size=2)
        lane = book.lane()
        a1, a2, b1, c1 = make_job("a1"), make_job("a2"), make_job("b1"), make_job("c1")
        book.add(a1, "s1")
        book.add(a2, "s1")
        book.add(b1, "s2")
        book.add(c1, "s3")
        assert len(lane) == 3
        assert lane.batch_size == 2
        assert book.take(lane.lane_id) == [a1, b1]
        assert book.take(lane.lane_id) == [c1]
        assert book.take(lane.lane_id) == []  # a2 waits for a1's answer
        assert len(lane) == 0
        assert len(book) == 1

    run(scenario)


def test_a_sequences_next_request_waits_until_the_one_before_is_answered() -> None:
    async def scenario() -> None:
        book = make_book(Clock())
        lane = book.lane()
        a1, a2, a3 = make_job("a1"), make_job("a2"), make_job("a3")
        for job in (a1, a2, a3):
            book.add(job, "s1")
        assert lane.take_ready() == [a1]
        assert lane.take_ready() is None
        answer(a1)
        await settle()
        assert lane.take_ready() == [a2]
        assert lane.take_ready() is None
        a2.fail(HandlerFailed("boom"))  # an error answers it too
        await settle()
        assert lane.take_ready() == [a3]
        assert len(book) == 0

    run(scenario)


def test_a_cancelled_running_request_frees_the_sequence() -> None:
    async def scenario() -> None:
        book = make_book(Clock())
        lane = book.lane()
        a1, a2 = make_job("a1"), make_job("a2")
        book.add(a1, "s1")
        book.add(a2, "s1")
        assert lane.take_ready() == [a1]
        a1.future.cancel()
        await settle()
        assert lane.take_ready() == [a2]
        assert book.open_sequences == 1

    run(scenario)


def test_take_skips_a_request_answered_while_it_waited() -> None:
    async def scenario() -> None:
        book = make_book(Clock())
        lane = book.lane()
        a1, a2 = make_job("a1"), make_job("a2")
        book.add(a1, "s1")
        book.add(a2, "s1")
        a1.future.cancel()  # its client went away
        assert lane.take_ready() == [a2]
        assert len(book) == 0

    run(scenario)


# --- lanes ---------------------------------------------------------------------------------


def test_an_adopted_sequence_stays_with_its_lane() -> None:
    async def scenario() -> None:
        book = make_book(Clock(), max_sequences=4)
        lane_a, lane_b = book.lane(), book.lane()
        assert lane_a.lane_id != lane_b.lane_id
        a1, a2, a3 = make_job("a1"), make_job("a2"), make_job("a3")
        book.add(a1, "s1")
        assert lane_a.take_ready() == [a1]
        book.add(a2, "s1")
        assert lane_b.take_ready() is None  # s1's request is running on lane A
        answer(a1)
        await settle()
        assert len(lane_b) == 0
        assert lane_b.take_ready() is None  # s1 is lane A's
        assert lane_a.take_ready() == [a2]
        answer(a2)
        await settle()
        book.add(a3, "s1")
        assert lane_b.take_ready() is None
        assert lane_a.take_ready() == [a3]

    run(scenario)


def test_each_lane_adopts_its_share_of_max_sequences() -> None:
    async def scenario() -> None:
        book = make_book(Clock(), max_sequences=2)
        lane_a = book.lane()
        assert book.share() == 2
        lane_b = book.lane()
        assert book.share() == 1
        a1, b1 = make_job("a1"), make_job("b1")
        book.add(a1, "s1")
        book.add(b1, "s2")
        assert len(lane_a) == 1
        assert lane_a.take_ready() == [a1]  # its share is one: s2 is left for lane B
        assert lane_a.take_ready() is None
        assert lane_b.take_ready() == [b1]

    run(scenario)


def test_a_closed_lanes_sequences_end_and_start_again_elsewhere() -> None:
    """The worker's state went with it: what waited is answered SequenceEnded, and the
    client's next request starts the sequence afresh on another lane."""

    async def scenario() -> None:
        book = make_book(Clock(), max_sequences=2)
        lane_a, lane_b = book.lane(), book.lane()
        a1, a2, b1 = make_job("a1"), make_job("a2"), make_job("b1")
        book.add(a1, "s1")
        book.add(b1, "s2")
        assert lane_a.take_ready() == [a1]
        assert lane_b.take_ready() == [b1]
        answer(a1)
        await settle()
        book.add(a2, "s1")
        assert lane_b.take_ready() is None  # s1 is still lane A's
        lane_a.close()
        error = ended_error(a2)
        assert isinstance(error, SequenceEnded) and "its worker went away" in str(error)
        assert book.open_sequences == 1  # s2
        again = make_job("again")
        book.add(again, "s1")
        assert book.share() == 2
        answer(b1)
        await settle()
        assert lane_b.take_ready() == [again]  # lane B now holds both

    run(scenario)


def test_every_admitted_sequence_has_a_lane_with_room() -> None:
    """maxNumSequence 5 over 2 lanes: shares of 3, not 2 (2 + 2 left one unserved)."""

    async def scenario() -> None:
        book = make_book(Clock(), max_sequences=5, batch_size=8)
        lane_a, lane_b = book.lane(), book.lane()
        jobs = [make_job(f"j{i}") for i in range(5)]
        for index, job in enumerate(jobs):
            book.add(job, f"s{index}")
        taken = (lane_a.take_ready() or []) + (lane_b.take_ready() or [])
        assert sorted(j.item.request_id for j in taken) == [f"j{i}" for i in range(5)]

    run(scenario)


# --- endings -------------------------------------------------------------------------------


def test_the_handler_ends_its_sequence_by_header() -> None:
    async def scenario() -> None:
        book = make_book(Clock())
        lane = book.lane()
        a1, a2, a3 = make_job("a1"), make_job("a2"), make_job("a3")
        for job in (a1, a2, a3):
            book.add(job, "s1")
        assert lane.take_ready() == [a1]
        answer(a1, {SEQUENCE_END_HEADER: "s1"})
        await settle()
        assert (book.open_sequences, len(book)) == (0, 0)
        assert a1.future.result().body == b"ok"
        for waiting in (a2, a3):
            error = ended_error(waiting)
            assert isinstance(error, SequenceEnded)
            assert str(error) == (
                "sequence s1 ended before this request ran: "
                f"the model ended it ({SEQUENCE_END_HEADER})"
            )
        fresh = make_job("fresh")
        book.add(fresh, "s1")  # the id names a new sequence now
        assert book.open_sequences == 1
        assert lane.take_ready() == [fresh]

    run(scenario)


def test_the_handler_may_end_other_sequences() -> None:
    async def scenario() -> None:
        book = make_book(Clock())
        lane = book.lane()
        a1, b1, c1 = make_job("a1"), make_job("b1"), make_job("c1")
        book.add(a1, "s1")
        book.add(b1, "s2")
        assert lane.take_ready() == [a1, b1]
        book.add(c1, "s3")
        answer(a1, {SEQUENCE_END_HEADER: "s2; s3; unknown;"})
        await settle()
        assert book.open_sequences == 1
        assert isinstance(ended_error(c1), SequenceEnded)
        assert not b1.future.done()  # running: its worker answers it

    run(scenario)


def test_a_failed_answer_ends_nothing() -> None:
    async def scenario() -> None:
        book = make_book(Clock())
        lane = book.lane()
        a1, a2 = make_job("a1"), make_job("a2")
        book.add(a1, "s1")
        book.add(a2, "s1")
        assert lane.take_ready() == [a1]
        a1.fail(HandlerFailed("boom"))
        await settle()
        assert (book.open_sequences, len(book)) == (1, 1)
        assert not a2.future.done()

    run(scenario)


def test_the_clients_last_request_closes_the_sequence_when_answered() -> None:
    async def scenario() -> None:
        book = make_book(Clock())
        lane = book.lane()
        a1, a2 = make_job("a1"), make_job("a2")
        book.add(a1, "s1")
        book.add(a2, "s1", last=True)
        assert lane.take_ready() == [a1]
        answer(a1)
        await settle()
        assert book.open_sequences == 1  # a1 was not the last
        assert lane.take_ready() == [a2]
        with pytest.raises(SequenceEnded):
            book.add(make_job(), "s1")
        assert book.open_sequences == 1  # ends when answered, not when taken
        answer(a2)
        await settle()
        assert (book.open_sequences, len(book)) == (0, 0)
        book.add(make_job(), "s1")  # a new sequence under the same id
        assert book.open_sequences == 1

    run(scenario)


# --- expiry --------------------------------------------------------------------------------


def test_an_idle_sequence_expires_after_max_idle() -> None:
    async def scenario() -> None:
        clock = Clock(0.0)
        book = make_book(clock, max_idle=10.0)
        lane = book.lane()
        a1 = make_job("a1")
        book.add(a1, "s1")
        assert lane.take_ready() == [a1]
        clock.now = 5.0
        answer(a1)
        await settle()  # idle from 5.0
        clock.now = 14.999
        book.expire()
        assert book.open_sequences == 1
        assert book.due(lane.lane_id, clock.now) == (False, 15.0)
        clock.now = 15.0
        book.expire()
        assert book.open_sequences == 0
        assert book.due(lane.lane_id, clock.now) == (False, None)

    run(scenario)


async def _held_by_lane_b_then_idle(
    book: SequenceBook, clock: Clock
) -> tuple[SequenceLane, SequenceLane]:
    """Sequence s1 adopted by lane B, answered, then ended idle."""
    lane_a, lane_b = book.lane(), book.lane()
    first = make_job("first")
    book.add(first, "s1")
    assert lane_b.take_ready() == [first]
    answer(first)
    await settle()
    clock.now = 20.0  # past max_idle (10 s)
    book.expire()
    assert book.open_sequences == 0
    return lane_a, lane_b


def test_a_sequence_continued_after_it_ended_idle_goes_back_to_its_lane() -> None:
    """TorchServe's stateful example with two workers: its handler keeps the running total
    per sequence; handed to the other worker, the total would start from 0 there."""

    async def scenario() -> None:
        clock = Clock(0.0)
        book = make_book(clock, max_sequences=4)
        lane_a, lane_b = await _held_by_lane_b_then_idle(book, clock)
        again = make_job("again")
        book.add(again, "s1")
        assert lane_a.take_ready() is None  # kept for lane B, which has room
        assert lane_b.take_ready() == [again]
        # Not remembered twice: once adopted again, its preference is spent.
        other = make_job("other")
        book.add(other, "s2")
        assert lane_a.take_ready() == [other]

    run(scenario)


def test_a_sequence_ended_idle_goes_elsewhere_when_its_lane_is_gone_or_full() -> None:
    async def scenario() -> None:
        clock = Clock(0.0)
        book = make_book(clock, max_sequences=4)
        lane_a, lane_b = await _held_by_lane_b_then_idle(book, clock)
        lane_b.close()
        again = make_job("again")
        book.add(again, "s1")
        assert lane_a.take_ready() == [again]  # lane B is gone

        clock2 = Clock(0.0)
        book2 = make_book(clock2, max_sequences=2)  # a share of 1 per lane
        lane_c, lane_d = await _held_by_lane_b_then_idle(book2, clock2)
        busy = make_job("busy")
        book2.add(busy, "s9")
        assert lane_d.take_ready() == [busy]  # lane D's one slot is taken
        back = make_job("back")
        book2.add(back, "s1")
        assert lane_c.take_ready() == [back]

    run(scenario)


def test_a_sequence_ended_otherwise_has_no_lane_to_go_back_to() -> None:
    """Only an idle end remembers the lane: the handler or the client ended it."""

    async def scenario() -> None:
        book = make_book(Clock(0.0), max_sequences=4)
        lane_a, lane_b = book.lane(), book.lane()
        first = make_job("first")
        book.add(first, "s1")
        assert lane_b.take_ready() == [first]
        answer(first, {SEQUENCE_END_HEADER: "s1"})
        await settle()
        assert book.open_sequences == 0
        again = make_job("again")
        book.add(again, "s1")
        assert lane_a.take_ready() == [again]

    run(scenario)


def test_a_new_request_restarts_the_idle_time() -> None:
    async def scenario() -> None:
        clock = Clock(0.0)
        book = make_book(clock, max_idle=10.0)
        lane = book.lane()
        a1, a2 = make_job("a1"), make_job("a2")
        book.add(a1, "s1")
        assert lane.take_ready() == [a1]
        answer(a1)
        await settle()  # idle from 0.0
        clock.now = 9.0
        book.add(a2, "s1")
        assert lane.take_ready() == [a2]
        answer(a2)
        await settle()  # idle from 9.0
        clock.now = 18.0
        book.expire()
        assert book.open_sequences == 1
        clock.now = 19.0
        book.expire()
        assert book.open_sequences == 0

    run(scenario)


def test_a_sequence_with_work_never_expires() -> None:
    async def scenario() -> None:
        clock = Clock(0.0)
        book = make_book(clock, max_idle=10.0, timeout=20.0)
        lane = book.lane()
        a1 = make_job("a1")
        book.add(a1, "s1")
        clock.now = 100.0
        book.expire()
        assert book.open_sequences == 1  # a request waits
        assert lane.take_ready() == [a1]
        clock.now = 200.0
        book.expire()
        assert book.open_sequences == 1  # a request runs
        answer(a1)
        await settle()
        book.expire()
        assert book.open_sequences == 0  # past its timeout, and idle now

    run(scenario)


def test_a_sequence_past_its_timeout_ends_at_its_first_idle_moment() -> None:
    async def scenario() -> None:
        clock = Clock(0.0)
        book = make_book(clock, max_idle=10.0, timeout=30.0)
        lane = book.lane()
        a1, a2 = make_job("a1"), make_job("a2")
        book.add(a1, "s1")
        assert lane.take_ready() == [a1]
        clock.now = 25.0
        answer(a1)
        await settle()  # idle from 25.0: max_idle alone would end it at 35.0
        clock.now = 28.0
        book.add(a2, "s1")
        assert lane.take_ready() == [a2]
        clock.now = 35.0
        book.expire()
        assert book.open_sequences == 1  # past its timeout, but busy
        clock.now = 36.0
        answer(a2)
        await settle()  # active at 36.0, yet its timeout (30.0) has passed
        book.expire()
        assert book.open_sequences == 0

    run(scenario)


def test_the_timeout_sets_the_wake_time_of_an_idle_sequence() -> None:
    async def scenario() -> None:
        clock = Clock(0.0)
        book = make_book(clock, max_idle=10.0, timeout=12.0)
        lane = book.lane()
        a1 = make_job("a1")
        book.add(a1, "s1")
        assert lane.take_ready() == [a1]
        clock.now = 5.0
        answer(a1)
        await settle()
        assert book.due(lane.lane_id, clock.now) == (False, 12.0)  # not 15.0
        clock.now = 12.0
        book.expire()
        assert book.open_sequences == 0

    run(scenario)


def test_add_drops_an_expired_sequence_first() -> None:
    async def scenario() -> None:
        clock = Clock(0.0)
        book = make_book(clock, max_sequences=1, max_idle=10.0)
        lane = book.lane()
        a1 = make_job("a1")
        book.add(a1, "s1")
        assert lane.take_ready() == [a1]
        answer(a1)
        await settle()
        with pytest.raises(Overloaded):
            book.add(make_job(), "s2")
        clock.now = 10.0
        b1 = make_job("b1")
        book.add(b1, "s2")  # s1 expired, which made room
        assert book.open_sequences == 1
        assert lane.take_ready() == [b1]

    run(scenario)


# --- due -----------------------------------------------------------------------------------


def test_due_takes_any_ready_request_without_wait_for_more() -> None:
    async def scenario() -> None:
        clock = Clock(0.0)
        book = make_book(clock, max_delay=5.0)
        lane = book.lane()
        assert book.due(lane.lane_id, clock.now) == (False, None)
        book.add(make_job(enqueued_at=0.0), "s1")
        assert book.due(lane.lane_id, clock.now) == (True, None)

    run(scenario)


def _two_owned_one_answered(
    book: SequenceBook, clock: Clock, lane_id: int
) -> tuple[list[Job], list[Job]]:
    """The lane owns s1 and s2 with a request running in each."""
    s1 = [make_job("a1", clock.now), make_job("a2")]
    s2 = [make_job("b1", clock.now), make_job("b2")]
    book.add(s1[0], "s1")
    book.add(s2[0], "s2")
    assert book.take(lane_id) == [s1[0], s2[0]]
    return s1, s2


def test_due_with_wait_for_more_holds_a_lone_request_for_max_delay() -> None:
    async def scenario() -> None:
        clock = Clock(0.0)
        book = make_book(clock, batch_size=4, max_delay=2.0, max_idle=100.0, wait_for_more=True)
        lane = book.lane()
        (a1, a2), _ = _two_owned_one_answered(book, clock, lane.lane_id)
        answer(a1)
        await settle()
        clock.now = 10.0
        a2.enqueued_at = 10.0
        book.add(a2, "s1")
        # s2 might yet send one to join it: wait until 12.0 (no idle sequence expires sooner)
        assert book.due(lane.lane_id, 10.0) == (False, 12.0)
        assert lane.take_ready() is None
        assert book.due(lane.lane_id, 11.999) == (False, 12.0)
        assert book.due(lane.lane_id, 12.0) == (True, None)
        clock.now = 12.0
        assert lane.take_ready() == [a2]

    run(scenario)


def test_due_with_wait_for_more_takes_a_full_batch_at_once() -> None:
    async def scenario() -> None:
        clock = Clock(0.0)
        book = make_book(clock, batch_size=2, max_delay=2.0, max_idle=100.0, wait_for_more=True)
        lane = book.lane()
        (a1, a2), (b1, b2) = _two_owned_one_answered(book, clock, lane.lane_id)
        c1 = make_job("c1", 0.0)
        book.add(c1, "s3")
        assert book.take(lane.lane_id) == [c1]  # the lane owns three sequences now
        answer(a1)
        answer(b1)
        await settle()
        clock.now = 10.0
        a2.enqueued_at = b2.enqueued_at = 10.0
        book.add(a2, "s1")
        assert book.due(lane.lane_id, 10.0) == (False, 12.0)
        book.add(b2, "s2")
        assert book.due(lane.lane_id, 10.0) == (True, None)  # two ready: a full batch
        assert lane.take_ready() == [a2, b2]

    run(scenario)


def test_due_with_wait_for_more_takes_at_once_when_none_could_join() -> None:
    async def scenario() -> None:
        clock = Clock(0.0)
        book = make_book(clock, batch_size=4, max_delay=2.0, wait_for_more=True)
        lane = book.lane()
        book.add(make_job("a1", 0.0), "s1")
        # the lane's only sequence is ready and no other is open: no point waiting
        assert book.due(lane.lane_id, 0.0) == (True, None)

    run(scenario)


def test_due_wakes_at_the_sooner_of_an_expiry_and_the_delay() -> None:
    async def scenario() -> None:
        clock = Clock(0.0)
        book = make_book(clock, batch_size=4, max_delay=20.0, max_idle=10.0, wait_for_more=True)
        lane = book.lane()
        (a1, _), (b1, b2) = _two_owned_one_answered(book, clock, lane.lane_id)
        clock.now = 1.0
        answer(a1)
        answer(b1)
        await settle()  # s1 idle from 1.0: it expires at 11.0
        b2.enqueued_at = 1.0
        book.add(b2, "s2")
        assert book.due(lane.lane_id, 1.0) == (False, 11.0)  # not 21.0
        book.max_delay = 2.0
        assert book.due(lane.lane_id, 1.0) == (False, 3.0)

    run(scenario)


# --- put_front and drain -------------------------------------------------------------------


def test_put_front_returns_a_taken_request_to_the_front_of_its_sequence() -> None:
    async def scenario() -> None:
        book = make_book(Clock())
        lane = book.lane()
        a1, a2 = make_job("a1"), make_job("a2")
        book.add(a1, "s1")
        book.add(a2, "s1")
        assert lane.take_ready() == [a1]
        assert len(book) == 1
        lane.put_front([a1])
        assert len(book) == 2
        assert not a1.future.done()
        assert lane.take_ready() == [a1]  # not running any more, and first again
        assert lane.take_ready() is None
        answer(a1)  # watched once, though taken twice
        await settle()
        assert lane.take_ready() == [a2]

    run(scenario)


def test_put_front_of_a_batch_returns_each_request_to_its_sequence() -> None:
    async def scenario() -> None:
        book = make_book(Clock())
        lane = book.lane()
        a1, b1 = make_job("a1"), make_job("b1")
        book.add(a1, "s1")
        book.add(b1, "s2")
        taken = book.take(lane.lane_id)
        assert taken == [a1, b1]
        lane.put_front(taken)
        assert len(book) == 2
        assert lane.take_ready() == [a1, b1]

    run(scenario)


def test_put_front_into_an_ended_sequence_fails_the_request() -> None:
    async def scenario() -> None:
        book = make_book(Clock())
        lane = book.lane()
        a1, b1 = make_job("a1"), make_job("b1")
        book.add(a1, "s1")
        book.add(b1, "s2")
        assert lane.take_ready() == [a1, b1]
        answer(b1, {SEQUENCE_END_HEADER: "s1"})  # s2's answer ends s1
        await settle()
        assert book.open_sequences == 1
        lane.put_front([a1])
        assert isinstance(ended_error(a1), SequenceEnded)
        assert len(book) == 0

    run(scenario)


def test_drain_takes_out_every_waiting_request() -> None:
    async def scenario() -> None:
        book = make_book(Clock())
        lane = book.lane()
        a1, a2, a3, b1 = make_job("a1"), make_job("a2"), make_job("a3"), make_job("b1")
        for job in (a1, a2, a3):
            book.add(job, "s1")
        book.add(b1, "s2")
        assert len(book) == 4
        assert lane.take_ready() == [a1, b1]
        assert len(book) == 2
        assert book.drain() == [a2, a3]
        assert len(book) == 0
        assert book.open_sequences == 2
        assert book.drain() == []
        assert not a2.future.done()  # the caller answers them

    run(scenario)


# --- waiting for a batch -------------------------------------------------------------------


def test_a_waiting_lane_wakes_when_a_request_is_added() -> None:
    async def scenario() -> None:
        book = make_book(Clock())
        lane = book.lane()
        task = asyncio.create_task(lane.take_batch())
        await asyncio.sleep(0)
        assert not task.done()
        a1 = make_job("a1")
        book.add(a1, "s1")
        assert await asyncio.wait_for(task, BOUND) == [a1]
        assert len(book) == 0

    run(scenario)


def test_a_waiting_lane_wakes_when_the_running_request_is_answered() -> None:
    async def scenario() -> None:
        book = make_book(Clock())
        lane = book.lane()
        a1, a2 = make_job("a1"), make_job("a2")
        book.add(a1, "s1")
        book.add(a2, "s1")
        assert await asyncio.wait_for(lane.take_batch(), BOUND) == [a1]
        task = asyncio.create_task(lane.take_batch())
        await asyncio.sleep(0)
        assert not task.done()
        answer(a1)
        assert await asyncio.wait_for(task, BOUND) == [a2]

    run(scenario)


def test_cancelling_a_wait_takes_nothing() -> None:
    async def scenario() -> None:
        book = make_book(Clock())
        lane = book.lane()
        task = asyncio.create_task(lane.take_batch())
        await asyncio.sleep(0)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        a1 = make_job("a1")
        book.add(a1, "s1")
        assert len(book) == 1
        assert lane.take_ready() == [a1]

    run(scenario)


# --- regressions -------------------------------------------------------------------------


def test_a_closed_lanes_late_answer_leaves_the_new_sequence_alone() -> None:
    """The request a closed lane was running is answered after its sequence ended and a
    new one of the same name began: the new one is neither ended nor blocked."""

    async def scenario() -> None:
        book = make_book(Clock())
        lane_a, lane_b = book.lane(), book.lane()
        a1, a2 = make_job("a1"), make_job("a2")
        book.add(a1, "s1", last=True)
        assert lane_a.take_ready() == [a1]
        lane_a.close()
        book.add(a2, "s1")  # a new s1
        answer(a1)  # the old s1's last request: it must not end the new one
        await settle()
        assert book.open_sequences == 1
        assert lane_b.take_ready() == [a2]

    run(scenario)


def test_a_request_of_an_ended_sequence_put_back_is_answered() -> None:
    """Put back after its sequence ended (and one of the same name began), a request is
    answered SequenceEnded, and the new sequence is served."""

    async def scenario() -> None:
        book = make_book(Clock())
        lane = book.lane()
        a1, x1, n1 = make_job("a1"), make_job("x1"), make_job("n1")
        book.add(a1, "s1")
        book.add(x1, "sx")
        assert lane.take_ready() == [a1, x1]
        answer(x1, {SEQUENCE_END_HEADER: "s1"})
        await settle()
        book.add(n1, "s1")
        lane.put_front([a1])
        assert isinstance(ended_error(a1), SequenceEnded)
        assert lane.take_ready() == [n1]

    run(scenario)


def test_a_cancelled_last_request_lets_the_client_go_on() -> None:
    async def scenario() -> None:
        book = make_book(Clock())
        lane = book.lane()
        first, last, later = make_job(), make_job(), make_job()
        book.add(first, "s1")
        book.add(last, "s1", last=True)
        assert lane.take_ready() == [first]
        last.future.cancel()  # its client went away while it waited
        answer(first)
        await settle()
        assert lane.take_ready() is None
        book.add(later, "s1")
        assert lane.take_ready() == [later]

    run(scenario)


def test_a_take_cancelled_as_a_request_wakes_it_takes_nothing_then_or_later() -> None:
    """Issue 47: a worker died the moment its lane's take was woken (its sequence's
    answer, or a new request). On Python 3.11 ``asyncio.wait_for`` swallowed that cancel:
    the take of the dead worker's lane went on, took the client's next request, and that
    request waited forever. The take must end cancelled, and a closed lane take nothing."""

    async def scenario() -> None:
        clock = Clock()
        book = make_book(clock, wait_for_more=False)
        dead, live = book.lane(), book.lane()
        first = make_job("first")
        book.add(first, "s")
        assert book.take(dead.lane_id) == [first]
        take = asyncio.ensure_future(dead.take_batch())
        await settle()  # waiting, with a time-out (the idle sequence's expiry)
        answer(first)
        await settle()  # the answer woke the take: it resumes on the next step
        take.cancel()  # the worker died at that moment
        dead.close()
        await asyncio.wait({take})
        assert take.cancelled()
        again = make_job("again")
        book.add(again, "s")  # a new sequence: the old one ended with its worker
        assert book.take(dead.lane_id) == []
        assert book.take(live.lane_id) == [again]

    run(scenario)


def _minted_job(name: str) -> Job:
    """A request that came without an id: the server named its sequence."""
    job = make_job(name)
    job.item.headers[SEQUENCE_START_HEADER] = "true"
    return job


def test_an_unclaimed_server_named_sequence_gives_its_slot_to_a_new_one() -> None:
    """Issue 47: each request without an id held a slot for ``sequenceMaxIdleMSec``. Once
    answered, and never continued, it is the first to make room."""

    async def scenario() -> None:
        clock = Clock()
        book = make_book(clock, max_sequences=2)
        lane = book.lane()
        named, unclaimed = make_job("named"), _minted_job("unclaimed")
        book.add(named, "named")
        book.add(unclaimed, "ts-seq-1")
        for job in book.take(lane.lane_id):
            answer(job)
        await settle()
        clock.now += 0.01  # both idle a moment: within the grace
        book.add(make_job("new"), "new")  # takes the unclaimed one's slot
        assert book.open_sequences == 2
        with pytest.raises(SequenceEnded, match="ended to make room for a new sequence"):
            book.add(make_job("late"), "ts-seq-1")  # its client is told, once
        with pytest.raises(Overloaded, match="open and busy"):
            book.add(make_job("again"), "ts-seq-1")  # "named" is within its grace

    run(scenario)


def test_past_its_grace_the_longest_idle_sequence_gives_way_and_a_busy_one_never() -> None:
    async def scenario() -> None:
        clock = Clock()
        book = make_book(clock, max_sequences=2, max_idle=10.0)
        lane = book.lane()
        book.add(make_job(), "old")
        book.add(make_job(), "busy")
        old, busy = book.take(lane.lane_id)
        answer(old)
        await settle()
        clock.now += book.eviction_grace - 0.001
        with pytest.raises(Overloaded):
            book.add(make_job(), "new")  # "old" idle, but within its grace
        clock.now += 0.001
        book.add(make_job(), "new")  # "old" gives way; "busy" runs, it never would
        assert book.open_sequences == 2 and not busy.future.done()
        with pytest.raises(SequenceEnded, match=r"after 1\.0 s idle"):
            book.add(make_job(), "old")
        clock.now += 100.0  # "busy" running, "new" waiting: never evicted, however long
        with pytest.raises(Overloaded):
            book.add(make_job(), "newest")

    run(scenario)
