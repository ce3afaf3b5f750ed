"""Models loaded on demand, and evicted least-recently-used when a memory budget would be
exceeded.

A model registered with ``loadOnDemand`` has no workers until its first request, which
waits in the model's queue while the model loads (bounded by its ``startupTimeout``: a
load that fails or times out answers what waits with the reason). Before a load, models
that are resident, on demand and idle (nothing queued, nothing running, not loading) are
evicted, least recently used first, until the model's expected footprint fits every
budget beside what stays: host memory, and each GPU's. A model's footprint is what its
workers measured when they loaded (``WorkerInfo.footprint_bytes``, ``gpu_bytes``); before
its first load, the size of its weights file stands in. Models without ``loadOnDemand``
count against the budget and are never evicted (pinned).

When nothing idle is left to evict, the model loads anyway, over the budget (logged and
counted): a request is never refused because other models are busy. The next loads evict
what has gone idle meanwhile.

A load that fails answers what waits with its error, and for a while after it the model's
requests are refused at once with that error instead of starting another load (which
would start and crash a worker process per request): 2 s after the first failure,
doubling with each failure in a row up to a minute; the next request after that tries
again, and a load that succeeds forgets the failures.

The policy (``ferry.capacity.budgets``: the budgets, what fits, what to evict) is pure;
``Residency`` applies it to the models (``OnDemandModel``: a ``ModelRunner`` in the
server, fakes in tests) with a clock it is given.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any, Protocol

from ferry.capacity.budgets import Candidate, Footprint, choose_evictions, fits, larger

log = logging.getLogger("ferry.scheduling")


class ModelGone(Exception):
    """The model was unregistered while a caller waited for it to load."""


class OnDemandModel(Protocol):
    """What residency needs of a model version."""

    @property
    def label(self) -> str: ...

    def resident(self) -> bool:
        """It has workers (loading or serving)."""

    def busy(self) -> bool:
        """Requests of it are queued or running."""

    def footprint(self) -> Footprint:
        """What its current workers measured at their load (empty when it has none)."""

    async def load(self) -> None:
        """Bring its workers up; raises when none could start."""

    async def evict(self) -> None:
        """Stop its workers, once the batches they hold are answered."""


class ResidencyEvents:
    """What residency reports (metrics); no-ops by default."""

    def loaded(self, label: str, seconds: float, footprint: Footprint) -> None:
        pass

    def evicted(self, label: str) -> None:
        pass

    def over_budget(self, label: str) -> None:
        pass


class LoadState:
    IDLE = "idle"
    LOADING = "loading"
    EVICTING = "evicting"


@dataclass
class _Entry:
    model: OnDemandModel
    on_demand: bool
    expected: Footprint
    """Its footprint at its last load; before one, an estimate (its weights' size)."""
    last_used: float = 0.0
    state: str = LoadState.IDLE
    task: asyncio.Task[None] | None = field(default=None, repr=False)
    evicted: asyncio.Event | None = field(default=None, repr=False)
    """Set when its eviction under way is done."""
    release: asyncio.Task[None] | None = field(default=None, repr=False)
    """Waiting for it to go idle, to evict it then (``Residency.release``)."""
    failures: int = 0
    """Loads that failed in a row."""
    retry_at: float = 0.0
    """Until then (the residency's clock) no load is tried: requests are refused."""
    last_error: str = ""


FIRST_RETRY_DELAY = 2.0
MAX_RETRY_DELAY = 60.0


def retry_delay(failures: int) -> float:
    """Seconds without a load after ``failures`` failed loads in a row.

    >>> [retry_delay(n) for n in (1, 2, 3, 10)]
    [2.0, 4.0, 8.0, 60.0]
    """
    return min(MAX_RETRY_DELAY, FIRST_RETRY_DELAY * 2.0 ** (failures - 1))


class Residency:
    """Which models are resident; loads on demand, evicts under ``budgets`` (bytes per
    device; empty: no budget, nothing is evicted)."""

    def __init__(
        self,
        budgets: Footprint,
        *,
        clock: Callable[[], float] = time.monotonic,
        events: ResidencyEvents | None = None,
    ) -> None:
        self.budgets = dict(budgets)
        self._clock = clock
        self._events = events or ResidencyEvents()
        self._entries: dict[str, _Entry] = {}
        self._lock = asyncio.Lock()
        """One load's evictions at a time: two loads must not count the same free memory."""

    # --- the models ---------------------------------------------------------------------

    def add(self, model: OnDemandModel, *, on_demand: bool, estimate: Footprint) -> None:
        self._entries[model.label] = _Entry(model, on_demand, dict(estimate), self._clock())

    def remove(self, label: str) -> None:
        entry = self._entries.pop(label, None)
        if entry is None:
            return
        for task in (entry.task, entry.release):
            if task is not None:
                task.cancel()

    def state(self, label: str) -> str:
        entry = self._entries.get(label)
        return entry.state if entry is not None else LoadState.IDLE

    def used(self, *, but: str | None = None) -> dict[str, int]:
        """Bytes per device the resident models hold (but ``but``'s)."""
        total: dict[str, int] = {}
        for label, entry in self._entries.items():
            if label == but:
                continue
            for device, size in self._held(entry).items():
                total[device] = total.get(device, 0) + size
        return total

    def committed(self) -> dict[str, int]:
        """Bytes per device every registered model takes or will take when loaded: its
        measured footprint while resident, else what it is expected to take."""
        total: dict[str, int] = {}
        for entry in self._entries.values():
            for device, size in larger(entry.expected, entry.model.footprint()).items():
                total[device] = total.get(device, 0) + size
        return total

    def has_room_for(self, label: str) -> bool:
        """Whether ``label``'s expected footprint fits every budget beside the models that
        would stay were every idle on-demand model evicted (those busy, loading or pinned).
        A load that would go over the budget anyway can then be refused instead (SageMaker's
        multi-model endpoints: ``ferry.service.multi_model``)."""
        entry = self._entries.get(label)
        if entry is None or not self.budgets:
            return True
        staying: dict[str, int] = {}
        for key, other in self._entries.items():
            if key == label or self._evictable(other):
                continue
            for device, size in self._held(other).items():
                staying[device] = staying.get(device, 0) + size
        return fits(staying, entry.expected, self.budgets)

    def over_budget(self) -> bool:
        """The resident models hold more than a budget allows."""
        return not fits(self.used(), {}, self.budgets)

    def _held(self, entry: _Entry) -> Footprint:
        if entry.state == LoadState.LOADING:
            return entry.expected  # not measured yet: what it is expected to take
        return larger(entry.expected, entry.model.footprint()) if entry.model.resident() else {}

    # --- requests -----------------------------------------------------------------------

    def wanted(self, label: str) -> None:
        """A request for ``label`` arrived: it was used now, and it loads if it is on demand
        and not resident."""
        entry = self._entries.get(label)
        if entry is None:
            return
        entry.last_used = self._clock()
        if self.refusal(label) is not None:
            return  # its last load failed a moment ago: the request was refused
        if entry.on_demand and entry.state == LoadState.IDLE and not entry.model.resident():
            self._start(entry, self._load(entry))

    def refusal(self, label: str) -> str | None:
        """Why ``label`` is not loaded for a request arriving now: its last load failed
        and the next is not due yet (None: a request may load it)."""
        entry = self._entries.get(label)
        if entry is None or entry.failures == 0 or entry.state != LoadState.IDLE:
            return None
        wait = entry.retry_at - self._clock()
        if wait <= 0:
            return None
        return (
            f"its last load on demand failed ({entry.last_error}); "
            f"the next is tried in {wait:.1f} s"
        )

    async def ensure_resident(self, label: str) -> None:
        """``wanted``, then wait for the load it started (or one under way, or the
        eviction under way and the load after it); raises what the load raised."""
        while (entry := self._entries.get(label)) is not None:
            if entry.evicted is not None:
                await entry.evicted.wait()
                continue
            self.wanted(label)
            if entry.task is None:
                return
            try:
                await asyncio.shield(entry.task)
            except asyncio.CancelledError:
                if entry.task is not None and entry.task.cancelled():
                    raise ModelGone(f"{label} was removed while it loaded") from None
                raise
        raise ModelGone(f"{label} is not registered")

    async def release(self, label: str, poll: float = 0.2) -> None:
        """Evict ``label`` now if it is an idle on-demand model, else as soon as it goes
        idle, unless it is wanted again first (Ray's multiplexing let go of it)."""
        entry = self._entries.get(label)
        if entry is None or not entry.on_demand:
            return
        async with self._lock:
            if self._evictable(entry):
                await self._evict(entry)
                return
        if entry.release is None and entry.model.resident():
            log.info("%s: evicted once its requests are answered", label)
            asked = self._clock()
            entry.release = asyncio.create_task(self._release_when_idle(entry, asked, poll))

    async def _release_when_idle(self, entry: _Entry, asked: float, poll: float) -> None:
        try:
            while entry.model.resident() and entry.last_used <= asked:
                async with self._lock:
                    if self._evictable(entry):
                        await self._evict(entry)
                        return
                await asyncio.sleep(poll)  # its requests end on their own time
        finally:
            entry.release = None

    def _start(self, entry: _Entry, work: Coroutine[Any, Any, None]) -> None:
        entry.state = LoadState.LOADING
        task = asyncio.create_task(work, name=f"load {entry.model.label}")
        entry.task = task
        task.add_done_callback(lambda done: self._done(entry, done))

    def _done(self, entry: _Entry, task: asyncio.Future[None]) -> None:
        if entry.task is task:
            entry.task = None
        if not task.cancelled() and task.exception() is not None:
            log.error("loading %s on demand failed: %s", entry.model.label, task.exception())

    async def _load(self, entry: _Entry) -> None:
        model = entry.model
        try:
            async with self._lock:
                fitted = await self._make_room(entry, entry.expected)
            started = self._clock()
            try:
                await model.load()
            except Exception as error:
                self._failed(entry, error)
                raise
            entry.failures = 0
            entry.expected = larger(entry.expected, model.footprint())
            seconds = self._clock() - started
            self._events.loaded(model.label, seconds, entry.expected)
            log.info("%s loaded on demand in %.2f s", model.label, seconds)
        finally:
            entry.state = LoadState.IDLE
        async with self._lock:  # measured now: it may have come out larger than expected
            fitted = await self._make_room(entry, {}) and fitted
        if not fitted:
            log.warning(
                "%s took the resident models past the memory budget (%s): nothing idle "
                "was left to evict",
                model.label,
                ", ".join(f"{d} {limit >> 20} MiB" for d, limit in self.budgets.items()),
            )
            self._events.over_budget(model.label)

    def _failed(self, entry: _Entry, error: Exception) -> None:
        entry.failures += 1
        entry.last_error = str(error) or type(error).__name__
        delay = retry_delay(entry.failures)
        entry.retry_at = self._clock() + delay
        log.warning(
            "%s: load on demand failed %d times in a row; its requests are refused for %.0f s",
            entry.model.label,
            entry.failures,
            delay,
        )

    async def _make_room(self, keep: _Entry, needed: Footprint) -> bool:
        """Evict idle on-demand models (never ``keep``) until ``needed`` fits the budgets
        beside what stays resident; whether it does."""
        if not self.budgets:
            return True
        label = keep.model.label
        candidates = [
            Candidate(key, larger(entry.expected, entry.model.footprint()), entry.last_used)
            for key, entry in self._entries.items()
            if key != label and self._evictable(entry)
        ]
        used = self.used(but=label if needed else None)
        victims, enough = choose_evictions(needed, used, candidates, self.budgets)
        for victim in victims:
            entry = self._entries.get(victim.label)
            if entry is not None and self._evictable(entry):  # still idle: earlier ones took time
                await self._evict(entry)
        return enough

    @staticmethod
    def _evictable(entry: _Entry) -> bool:
        model = entry.model
        return (
            entry.on_demand
            and entry.state == LoadState.IDLE
            and model.resident()
            and not model.busy()
        )

    async def _evict(self, entry: _Entry) -> None:
        model = entry.model
        entry.state = LoadState.EVICTING
        entry.evicted = asyncio.Event()
        try:
            await model.evict()
            self._events.evicted(model.label)
            log.info("%s evicted (least recently used)", model.label)
        finally:
            entry.state = LoadState.IDLE
            entry.evicted.set()
            entry.evicted = None
            registered = self._entries.get(model.label) is entry
            if registered and model.busy():  # a request arrived meanwhile: it loads again
                self._start(entry, self._load(entry))
