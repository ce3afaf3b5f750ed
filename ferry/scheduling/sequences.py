"""Stateful sequences: TorchServe's sequence batching (``sequenceBatching: true``).

A stateful model (a streaming recogniser, a running total) keeps state per *sequence* of
requests, named by the ``ts_request_sequence_id`` header. For its answers to be right,
each sequence's requests must run in order, one at a time, on the worker that holds its
state. So, as TorchServe's ``SequenceBatching``:

* every sequence has its own queue (``maxSequenceJobQueueSize`` requests), and the model
  holds at most ``maxNumSequence`` sequences at once;
* a worker *adopts* a waiting sequence (up to its share of ``maxNumSequence``) and keeps
  it: every later request of that sequence goes to that worker;
* a batch takes at most one request per sequence, and a sequence's next request waits
  until the one before it is answered;
* a sequence ends when it has been idle ``sequenceMaxIdleMSec`` (or, once
  ``sequenceTimeoutMSec`` after it began, at its first idle moment), when the handler
  names it in the response header ``ts_request_sequence_end``, or — Ferry — after a
  request the client sent with ``ts_request_sequence_end: true``. A request without an
  id starts a new sequence: the server names it ``ts-seq-<uuid>`` and tells the handler
  with ``ts_request_sequence_start: true``.

Slots are shared fairly: at ``maxNumSequence``, a new sequence takes the slot of an idle
one rather than be refused. First one the server named for a request without an id and
that no request continued (an id-less request holds no slot past its answer when another
client needs it), then the one idle longest, if idle ``eviction_grace`` at least (so a
client between an answer and its next request keeps its sequence). A client that keeps
every sequence busy is load, and a new sequence is refused (503) as before. The next
request of a sequence ended that way is answered ``SequenceEnded``, saying why, and the
one after starts afresh: never a silent restart on missing state.

A sequence that ended idle and is continued under its name starts again (as in
TorchServe) on the worker that held it, while that worker lives and has room: its
handler's state for the sequence, if it keeps any past the end, is there. TorchServe
hands it to whichever worker asks first, so a handler's state may be split between
workers (its stateful example answers 1, 2, 4 where 1, 3, 6 was meant).

Where TorchServe leaves a request of an ended sequence waiting forever, Ferry answers it
``SequenceEnded``. A sequence lives with its worker's state: when the worker goes (dies,
is recycled, is scaled away), the sequence ends, its in-flight request answered with the
worker's error (as TorchServe does) and its waiting ones ``SequenceEnded``; the client's
next request starts it again, on another worker.

This module is the bookkeeping; ``SequenceLane`` is one worker's view of it, which the
dispatcher takes batches from as it would from the model's queue.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import logging
import time
import uuid
from collections import OrderedDict, deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from ferry.errors import Overloaded, SequenceEnded
from ferry.handlers.contract.context import (
    SEQUENCE_END_HEADER,
    SEQUENCE_ID_HEADER,
    SEQUENCE_START_HEADER,
)
from ferry.scheduling.jobs import Job
from ferry.scheduling.waiting import wake_or_time_out

log = logging.getLogger("ferry.scheduling")

EVICTED_REMEMBERED = 4096


@dataclass(frozen=True)
class SequenceSettings:
    """A stateful model's limits, from its model-config.yaml."""

    max_sequences: int
    """Sequences open at once (``maxNumSequence``, at least batchSize times workers)."""
    queue_size: int
    """Requests one sequence may hold waiting (``maxSequenceJobQueueSize``)."""
    max_idle: float
    """Seconds a sequence may wait for its next request (``sequenceMaxIdleMSec``)."""
    timeout: float | None = None
    """Seconds after which a sequence ends at its first idle moment
    (``sequenceTimeoutMSec``); None: never."""


def sequence_of(headers: Mapping[str, str]) -> tuple[str, dict[str, str]]:
    """The request's sequence id and the headers its handler sees: a request without one
    starts a new sequence (``ts-seq-<uuid>``, with ``ts_request_sequence_start: true``),
    as TorchServe names it."""
    given = headers.get(SEQUENCE_ID_HEADER, "")
    if given:
        return given, dict(headers)
    minted = f"ts-seq-{uuid.uuid4()}"
    return minted, {**headers, SEQUENCE_ID_HEADER: minted, SEQUENCE_START_HEADER: "true"}


def asks_to_end(headers: Mapping[str, str]) -> bool:
    """Whether the client says this request is its sequence's last."""
    return headers.get(SEQUENCE_END_HEADER, "").strip().lower() == "true"


def ended_by(response_headers: Mapping[str, str]) -> list[str]:
    """The sequences a handler's answer ends (``ts_request_sequence_end: a;b``)."""
    value = response_headers.get(SEQUENCE_END_HEADER, "")
    return [name.strip() for name in value.split(";") if name.strip()]


@dataclass
class Sequence:
    sequence_id: str
    started_at: float
    active_at: float
    """When it last got a request or an answer: its idle time counts from here."""
    waiting: deque[Job] = field(default_factory=deque)
    owner: int | None = None
    """The lane (worker) that holds its state; None until one adopts it."""
    running: Job | None = None
    """Its request a worker has now; the next waits until this one is answered."""
    last: Job | None = None
    """The request its client marked as the last; the sequence ends when it is answered."""
    minted: bool = False
    """The server named it, for a request without an id."""
    requests: int = 0
    """Requests it has taken in (a minted one with 1 was never continued)."""
    preferred: int | None = None
    """The lane that held it before it ended idle: the one to adopt it again."""

    def idle(self) -> bool:
        """Nothing running and nothing wanted waiting (a request whose client went away
        while it waited holds no slot)."""
        return self.running is None and all(job.future.done() for job in self.waiting)

    def next_job(self) -> Job | None:
        """Its first waiting request still wanted (one answered while it waited, say its
        client went away, is dropped)."""
        while self.waiting and self.waiting[0].future.done():
            dropped = self.waiting.popleft()
            if dropped is self.last:  # the client's last request went: it may send more
                self.last = None
        return self.waiting[0] if self.waiting else None


class SequenceBook:
    """Every open sequence of one model version, and the batches each lane may take."""

    def __init__(
        self,
        settings: SequenceSettings,
        batch_size: int,
        max_delay: float,
        clock: Callable[[], float] = time.monotonic,
        *,
        wait_for_more: bool = False,
    ) -> None:
        self.settings = settings
        self.batch_size = batch_size
        self.max_delay = max_delay
        self.wait_for_more = wait_for_more
        """TorchServe's rule (``batchPolicy: fixed_window``): a batch short of full waits
        up to ``max_delay`` for more sequences' requests. Otherwise a worker takes what is
        ready when it asks: each sequence's client waits for one answer before it sends
        the next request, so waiting seldom fills a batch, and under load batches fill
        anyway while the worker is busy."""
        self._clock = clock
        self._sequences: dict[str, Sequence] = {}
        """Open sequences, oldest first (the order lanes adopt them in)."""
        self._lanes: set[int] = set()
        self._lane_ids = itertools.count(1)
        self._waiters: list[asyncio.Future[None]] = []
        self._evicted: OrderedDict[str, str] = OrderedDict()
        """Sequences ended to make room, and why: their next request is told so (a few
        thousand remembered; older ones simply start afresh)."""
        self._held_by: OrderedDict[str, int] = OrderedDict()
        """Sequences that ended idle, and the lane that held them: continued, they go
        back to it (as many remembered as ``_evicted``)."""
        self._watched: set[int] = set()
        """The jobs whose answer ``_answered`` is told (by identity: a job taken twice,
        put back between, is watched once)."""

    def now(self) -> float:
        return self._clock()

    def __len__(self) -> int:
        """Requests waiting in every sequence."""
        return sum(len(sequence.waiting) for sequence in self._sequences.values())

    @property
    def open_sequences(self) -> int:
        return len(self._sequences)

    # --- requests in -------------------------------------------------------------------

    def add(self, job: Job, sequence_id: str, *, last: bool = False) -> None:
        """Queue ``job`` in its sequence, opening the sequence if need be. Raises
        ``Overloaded`` at ``maxNumSequence`` sequences or a full sequence queue, and
        ``SequenceEnded`` behind a request its client marked as the last."""
        self.expire()
        now = self._clock()
        sequence = self._sequences.get(sequence_id)
        if sequence is None:
            why = self._evicted.pop(sequence_id, None)
            if why is not None:
                raise SequenceEnded(f"sequence {sequence_id} {why}; send again to start it anew")
            if len(self._sequences) >= self.settings.max_sequences and not self._make_room(now):
                raise Overloaded(
                    f"{len(self._sequences)} sequences are open and busy, the most this model "
                    "holds (maxNumSequence); end one or retry later"
                )
            minted = job.item.headers.get(SEQUENCE_START_HEADER, "") == "true"
            preferred = self._held_by.pop(sequence_id, None)
            sequence = Sequence(sequence_id, now, now, minted=minted, preferred=preferred)
            self._sequences[sequence_id] = sequence
        elif sequence.last is not None:
            raise SequenceEnded(
                f"sequence {sequence_id} is ending: its last request "
                f"({SEQUENCE_END_HEADER}) is not answered yet"
            )
        if len(sequence.waiting) >= self.settings.queue_size:
            raise Overloaded(
                f"sequence {sequence_id} has {len(sequence.waiting)} requests waiting, the "
                "most it may (maxSequenceJobQueueSize)"
            )
        job.sequence_id = sequence_id
        sequence.waiting.append(job)
        sequence.requests += 1
        sequence.active_at = now
        if last:
            sequence.last = job
        self._wake_all()

    @property
    def eviction_grace(self) -> float:
        """Seconds a sequence its client named (or continued) must have been idle before
        a new sequence may take its slot: half its idle limit, at most a second."""
        return min(1.0, self.settings.max_idle / 2)

    def _make_room(self, now: float) -> bool:
        """End the idle sequence a new one may replace (the class docstring); whether
        there was one."""
        idle = [s for s in self._sequences.values() if s.idle() and s.last is None]
        unclaimed = [s for s in idle if s.minted and s.requests == 1]
        settled = [s for s in idle if now - s.active_at >= self.eviction_grace]
        victims = unclaimed or settled
        if not victims:
            return False
        victim = min(victims, key=lambda s: s.active_at)
        why = (
            f"was ended to make room for a new sequence after {now - victim.active_at:.1f} s "
            f"idle ({self.settings.max_sequences} sequences open, maxNumSequence)"
        )
        self._end(victim.sequence_id, why)
        self._evicted[victim.sequence_id] = why
        while len(self._evicted) > EVICTED_REMEMBERED:
            self._evicted.popitem(last=False)
        log.info("sequence %s %s", victim.sequence_id, why)
        return True

    def put_front(self, jobs: Iterable[Job]) -> None:
        """Jobs a lane took but no worker ran go back to the front of their sequences."""
        for job in reversed(list(jobs)):
            sequence = self._sequences.get(job.sequence_id or "")
            # Not its sequence's running request: the sequence it was taken from ended
            # (one of the same name may have begun since).
            if sequence is None or sequence.running is not job:
                job.fail(SequenceEnded(f"sequence {job.sequence_id} ended before this request ran"))
                continue
            sequence.running = None
            sequence.waiting.appendleft(job)
            if sequence.owner is not None and sequence.owner not in self._lanes:
                self._end(sequence.sequence_id, "its worker went away, and its state with it")
        self._wake_all()

    def drain(self) -> list[Job]:
        """Take every waiting request out (to answer them: the model is stopping)."""
        jobs = [job for sequence in self._sequences.values() for job in sequence.waiting]
        for sequence in self._sequences.values():
            sequence.waiting.clear()
        return jobs

    # --- lanes -------------------------------------------------------------------------

    def lane(self) -> SequenceLane:
        """A worker's view: it adopts sequences, and takes batches from them only."""
        lane_id = next(self._lane_ids)
        self._lanes.add(lane_id)
        self._wake_all()  # the others' share of maxNumSequence just shrank
        return SequenceLane(self, lane_id)

    def close_lane(self, lane_id: int) -> None:
        """The worker is gone (it died, was recycled or scaled away), and the state it kept
        for its sequences with it: they end. What waited in them is answered
        ``SequenceEnded``; the client starts again. (Handed to another worker, a sequence
        would carry on from nothing, and answer wrongly without a word.)"""
        self._lanes.discard(lane_id)
        for sequence in list(self._sequences.values()):
            if sequence.owner == lane_id:
                self._end(sequence.sequence_id, "its worker went away, and its state with it")
        self._wake_all()

    def share(self) -> int:
        """How many sequences one lane may hold: ``maxNumSequence / workers``, rounded up
        (TorchServe rounds down, which leaves admitted sequences no worker may adopt)."""
        return max(1, -(-self.settings.max_sequences // max(1, len(self._lanes))))

    def ready(self, lane_id: int) -> list[Sequence]:
        """The sequences whose next request the lane may take now, oldest first: its own
        with a request waiting and none running, then unowned ones up to its share."""
        owned = [s for s in self._sequences.values() if s.owner == lane_id]
        ready = [s for s in owned if s.running is None and s.next_job() is not None]
        room = self.share() - len(owned)
        for sequence in self._sequences.values():
            if room <= 0:
                break
            adoptable = sequence.owner is None and sequence.running is None
            if (
                adoptable
                and not self._kept_for_another(sequence, lane_id)
                and sequence.next_job() is not None
            ):
                ready.append(sequence)
                room -= 1
        return ready

    def _kept_for_another(self, sequence: Sequence, lane_id: int) -> bool:
        """Whether ``sequence`` waits for the lane that held it before it ended idle:
        another lane than ``lane_id``, still open and with room for it."""
        preferred = sequence.preferred
        if preferred is None or preferred == lane_id or preferred not in self._lanes:
            return False
        held = sum(1 for s in self._sequences.values() if s.owner == preferred)
        return held < self.share()

    def due(self, lane_id: int, now: float) -> tuple[bool, float | None]:
        """Whether the lane should take a batch now, and else when to look again. Now:
        any ready request, unless ``wait_for_more``; then a full batch, or the oldest
        ready request has waited ``max_delay``, or every sequence the lane holds is ready
        (no other could join the batch)."""
        ready = self.ready(lane_id)
        wake = self._next_expiry()
        if not ready:
            return False, wake
        if not self.wait_for_more:
            return True, None
        oldest = min(s.waiting[0].enqueued_at for s in ready)
        owned = sum(1 for s in self._sequences.values() if s.owner == lane_id)
        all_ready = len(ready) >= owned and not any(
            s.owner is None and s not in ready for s in self._sequences.values()
        )
        if len(ready) >= self.batch_size or all_ready or now >= oldest + self.max_delay:
            return True, None
        release = oldest + self.max_delay
        return False, release if wake is None else min(wake, release)

    def take(self, lane_id: int) -> list[Job]:
        """The lane's next batch: one request from each ready sequence, up to batch size
        (none for a closed lane: its worker is gone)."""
        if lane_id not in self._lanes:
            return []
        self.expire()
        jobs: list[Job] = []
        for sequence in self.ready(lane_id)[: self.batch_size]:
            job = sequence.waiting.popleft()
            sequence.owner = lane_id
            sequence.running = job
            if id(job) not in self._watched:
                self._watched.add(id(job))
                job.future.add_done_callback(functools.partial(self._answered, sequence, job))
            jobs.append(job)
        return jobs

    # --- answers and endings -----------------------------------------------------------

    def _answered(self, sequence: Sequence, job: Job, _: object = None) -> None:
        self._watched.discard(id(job))
        if sequence.running is job:
            sequence.running = None
        sequence.active_at = self._clock()
        current = self._sequences.get(sequence.sequence_id) is sequence  # not ended since
        if sequence.last is job and current:
            self._end(sequence.sequence_id, "its client's last request was answered")
        future = job.future
        if not future.cancelled() and future.exception() is None:
            for ended in ended_by(future.result().headers):
                self._end(ended, f"the model ended it ({SEQUENCE_END_HEADER})")
        self._wake_all()

    def _end(self, sequence_id: str, why: str) -> None:
        sequence = self._sequences.pop(sequence_id, None)
        if sequence is None:
            return
        error = SequenceEnded(f"sequence {sequence_id} ended before this request ran: {why}")
        for job in sequence.waiting:
            job.fail(error)

    def expire(self) -> None:
        """End the idle sequences whose time is up."""
        now = self._clock()
        for sequence in list(self._sequences.values()):
            expiry = self._expiry(sequence)
            if expiry is not None and now >= expiry:
                del self._sequences[sequence.sequence_id]
                if sequence.owner is not None:
                    self._held_by[sequence.sequence_id] = sequence.owner
                    while len(self._held_by) > EVICTED_REMEMBERED:
                        self._held_by.popitem(last=False)

    def _expiry(self, sequence: Sequence) -> float | None:
        """When an idle sequence ends (None while it has work)."""
        if not sequence.idle():
            return None
        end = sequence.active_at + self.settings.max_idle
        if self.settings.timeout is not None:
            end = min(end, sequence.started_at + self.settings.timeout)
        return end

    def _next_expiry(self) -> float | None:
        expiries = [e for s in self._sequences.values() if (e := self._expiry(s)) is not None]
        return min(expiries, default=None)

    # --- waiting -----------------------------------------------------------------------

    def _wake_all(self) -> None:
        for waiter in self._waiters:
            if not waiter.done():
                waiter.set_result(None)
        self._waiters.clear()

    async def wait_for_batch(self, lane_id: int) -> list[Job]:
        """Wait until the lane is due a batch, and take it. Cancelling takes nothing; a
        closed lane takes nothing either (an empty batch)."""
        while lane_id in self._lanes:
            self.expire()
            now = self._clock()
            due, wake_at = self.due(lane_id, now)
            if due:
                jobs = self.take(lane_id)
                if jobs:
                    return jobs
                continue
            waiter = asyncio.get_running_loop().create_future()
            self._waiters.append(waiter)
            try:
                await wake_or_time_out(waiter, wake_at, now)
            finally:
                if waiter in self._waiters:
                    self._waiters.remove(waiter)
        return []


class SequenceLane:
    """One worker's source of batches from a ``SequenceBook`` (what the dispatcher takes
    from instead of the model's queue)."""

    def __init__(self, book: SequenceBook, lane_id: int) -> None:
        self.book = book
        self.lane_id = lane_id

    def __len__(self) -> int:
        return len(self.book.ready(self.lane_id))

    @property
    def batch_size(self) -> int:
        return self.book.batch_size

    def take_ready(self) -> list[Job] | None:
        due, _ = self.book.due(self.lane_id, self.book.now())
        return (self.book.take(self.lane_id) or None) if due else None

    async def take_batch(self) -> list[Job]:
        return await self.book.wait_for_batch(self.lane_id)

    def put_front(self, jobs: Iterable[Job]) -> None:
        self.book.put_front(jobs)

    def close(self) -> None:
        self.book.close_lane(self.lane_id)
