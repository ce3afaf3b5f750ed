"""A load generator for any server with TorchServe's inference API, or an Open Inference
Protocol endpoint, over HTTP or gRPC (``ferry_bench.targets``).

Closed loop (``concurrency`` clients, each waiting for its answer) or open loop (Poisson
arrivals at ``rate`` per second, answered or not), stopped after ``requests`` requests or
``duration`` seconds, whichever comes first.
"""

from __future__ import annotations

import asyncio
import itertools
import random
import sys
import time
from collections import Counter
from collections.abc import Callable, Coroutine, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from ferry_bench.arrivals import bursty_offsets, poisson_offsets, step_offsets
from ferry_bench.stats import percentile
from ferry_bench.target_types import NoAnswer, Target, TargetSpec
from ferry_bench.targets import open_target

MAX_IN_FLIGHT = 10_000
"""Open loop: beyond this many unanswered requests, arrivals are counted as dropped."""
MAX_CONNECTIONS = 1000
"""Open loop over HTTP: connections kept open at most (arrivals beyond wait for one)."""


@dataclass(frozen=True)
class Sample:
    index: int
    sent_s: float
    """Seconds from the start of the run (open loop: when it was scheduled)."""
    latency_ms: float
    ok: bool


@dataclass
class LoadResult:
    requests: int
    seconds: float
    latencies_ms: list[float] = field(default_factory=list)
    """Latencies of successful (2xx) answers only: what the percentiles describe."""
    error_latencies_ms: list[float] = field(default_factory=list)
    statuses: Counter[int] = field(default_factory=Counter)
    codes: Counter[str] = field(default_factory=Counter)
    """gRPC status code names, for gRPC targets (``statuses`` holds their HTTP stand-ins)."""
    bodies: list[tuple[int, int, bytes]] = field(default_factory=list)
    """(request index, status, body), kept only when asked for."""
    transport_errors: Counter[str] = field(default_factory=Counter)
    dropped: int = 0
    samples: list[Sample] = field(default_factory=list)
    """Every answered request: when it was sent, how long it took, whether it succeeded."""
    arrivals_s: list[float] = field(default_factory=list)
    """Open loop: every arrival's offset from the start (dropped ones included)."""

    @property
    def answered(self) -> int:
        return len(self.latencies_ms) + len(self.error_latencies_ms)

    @property
    def failed(self) -> int:
        """Requests that did not succeed: error answers, no answer, or dropped."""
        return len(self.error_latencies_ms) + sum(self.transport_errors.values()) + self.dropped

    @property
    def throughput(self) -> float:
        """Goodput: successful answers per second (errors are no throughput)."""
        return len(self.latencies_ms) / self.seconds if self.seconds > 0 else 0.0

    @property
    def error_rate(self) -> float:
        return self.failed / self.requests if self.requests else 0.0

    def latency_ms(self, q: float) -> float:
        """Percentile ``q`` of successful answers' latencies."""
        return percentile(self.latencies_ms, q)


@dataclass(frozen=True)
class LoadSpec:
    url: str
    payloads: Sequence[bytes]
    concurrency: int | None = None
    rate: float | None = None
    requests: int | None = None
    duration: float | None = None
    content_type: str = "application/octet-stream"
    seed: int = 0
    progress: bool = False
    token: str | None = None
    bursts: tuple[float, float] | None = None
    """Open loop: ``rate`` only during ON seconds, then OFF seconds of silence, repeated."""
    steps: tuple[tuple[float, float], ...] | None = None
    """Open loop instead of ``rate``: (rate, seconds) steps in turn; the run ends with them."""

    @property
    def open_loop(self) -> bool:
        return self.concurrency is None

    def arrivals(self) -> Iterator[float]:
        """The open loop's arrival offsets (seconds), from ``seed``."""
        rng = random.Random(self.seed)
        if self.steps:
            return step_offsets(self.steps, rng)
        if self.rate is None:
            raise ValueError("a closed loop has no arrival schedule")
        if self.bursts is not None:
            return bursty_offsets(self.rate, *self.bursts, rng)
        return poisson_offsets(self.rate, rng)

    def target(self) -> TargetSpec:
        connections = self.concurrency or MAX_CONNECTIONS
        return TargetSpec(self.url, self.payloads, self.content_type, self.token, connections)


class _Progress:
    """One self-rewriting stderr line, only when stderr is a terminal."""

    def __init__(self, enabled: bool, total: int | None, duration: float | None) -> None:
        self.enabled = enabled and sys.stderr.isatty()
        self.total, self.duration = total, duration
        self.start = time.perf_counter()
        self.last = 0.0

    def update(self, done: int, failed: int) -> None:
        now = time.perf_counter()
        if not self.enabled or now - self.last < 0.2:
            return
        self.last = now
        elapsed = now - self.start
        share = done / self.total if self.total else min(1.0, elapsed / (self.duration or 1))
        bar = "#" * int(share * 30)
        errors = f", {failed} failed" if failed else ""
        rate = done / max(elapsed, 1e-9)
        sys.stderr.write(f"\r[{bar:<30}] {done} answers, {rate:.0f}/s{errors} ")
        sys.stderr.flush()

    def close(self) -> None:
        if self.enabled:
            sys.stderr.write("\n")


async def run_load(
    spec: LoadSpec,
    *,
    keep_bodies: bool = False,
    on_response: Callable[[int, int, bytes], None] | None = None,
    target: Target | None = None,
) -> LoadResult:
    """Run the load ``spec`` describes, against ``target`` if given (a fake, in tests),
    else the one its URL names; raises ``UnsupportedTarget`` for a URL or payloads no
    target speaks."""
    if [spec.concurrency, spec.rate, spec.steps].count(None) != 2:
        raise ValueError("give exactly one of concurrency, rate or steps")
    if spec.steps is None and spec.requests is None and spec.duration is None:
        raise ValueError("give requests or duration (or both: the run ends at the first)")
    result = LoadResult(requests=0, seconds=0.0)
    progress = _Progress(spec.progress, spec.requests, spec.duration)
    target = target or open_target(spec.target())

    run_start = time.perf_counter()

    async def send(index: int) -> None:
        start = time.perf_counter()
        try:
            answer = await target.send(index)
        except NoAnswer as exc:
            result.transport_errors[exc.kind] += 1
            return
        latency_ms = (time.perf_counter() - start) * 1000
        # Open loop: the arrival's scheduled time, so a late start never moves it to a
        # later window of the report.
        sent_s = result.arrivals_s[index] if spec.open_loop else start - run_start
        result.samples.append(Sample(index, sent_s, latency_ms, answer.ok))
        (result.latencies_ms if answer.ok else result.error_latencies_ms).append(latency_ms)
        result.statuses[answer.status] += 1
        if answer.code is not None:
            result.codes[answer.code] += 1
        if keep_bodies:
            result.bodies.append((index, answer.status, answer.body))
        if on_response is not None:
            on_response(index, answer.status, answer.body)
        progress.update(result.answered, result.failed)

    try:
        run_start = start = time.perf_counter()
        deadline = start + spec.duration if spec.duration is not None else None
        if spec.concurrency is not None:
            await _closed_loop(send, spec.concurrency, spec.requests, deadline, result)
        else:
            requests = None if spec.steps else spec.requests
            await _open_loop(send, spec.arrivals(), requests, deadline, result)
        result.seconds = time.perf_counter() - start
    finally:
        await target.close()
        progress.close()
    return result


Sender = Callable[[int], Coroutine[Any, Any, None]]


async def _closed_loop(
    send: Sender,
    concurrency: int,
    requests: int | None,
    deadline: float | None,
    result: LoadResult,
) -> None:
    counter = itertools.count()

    async def client() -> None:
        while True:
            if deadline is not None and time.perf_counter() >= deadline:
                return
            index = next(counter)
            if requests is not None and index >= requests:
                return
            result.requests += 1
            await send(index)

    await asyncio.gather(*(client() for _ in range(concurrency)))


async def _open_loop(
    send: Sender,
    offsets: Iterator[float],
    requests: int | None,
    deadline: float | None,
    result: LoadResult,
) -> None:
    start = time.perf_counter()
    in_flight: set[asyncio.Task[None]] = set()
    for index, offset in enumerate(offsets):
        if requests is not None and index >= requests:
            break
        if deadline is not None and start + offset >= deadline:
            break
        delay = start + offset - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)  # the arrival schedule itself, not a synchronisation
        result.requests += 1
        result.arrivals_s.append(offset)
        if len(in_flight) >= MAX_IN_FLIGHT:
            result.dropped += 1
            continue
        task = asyncio.create_task(send(index))
        in_flight.add(task)
        task.add_done_callback(in_flight.discard)
    if in_flight:
        await asyncio.gather(*in_flight)


async def run_closed_loop(
    url: str,
    payloads: Sequence[bytes],
    *,
    concurrency: int,
    requests: int,
    content_type: str = "application/octet-stream",
    keep_bodies: bool = False,
    on_response: Callable[[int, int, bytes], None] | None = None,
) -> LoadResult:
    """Send ``requests`` POSTs from ``concurrency`` clients, each waiting for its answer.

    Request ``i`` carries ``payloads[i % len(payloads)]``.
    """
    spec = LoadSpec(
        url, payloads, concurrency=concurrency, requests=requests, content_type=content_type
    )
    return await run_load(spec, keep_bodies=keep_bodies, on_response=on_response)
