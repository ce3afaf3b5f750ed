"""A closed-loop HTTP load generator for any server with TorchServe's inference API."""

from __future__ import annotations

import asyncio
import itertools
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import aiohttp

from ferry.bench.stats import percentile


@dataclass
class LoadResult:
    requests: int
    seconds: float
    latencies_ms: list[float] = field(default_factory=list)
    statuses: Counter[int] = field(default_factory=Counter)
    bodies: list[tuple[int, int, bytes]] = field(default_factory=list)
    """(request index, status, body), kept only when asked for."""

    @property
    def throughput(self) -> float:
        return self.requests / self.seconds if self.seconds > 0 else 0.0

    def latency_ms(self, q: float) -> float:
        return percentile(self.latencies_ms, q)


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
    counter = itertools.count()
    result = LoadResult(requests=requests, seconds=0.0)
    headers = {"Content-Type": content_type}
    connector = aiohttp.TCPConnector(limit=concurrency, force_close=False)
    timeout = aiohttp.ClientTimeout(total=600)

    async def client(session: aiohttp.ClientSession) -> None:
        while (index := next(counter)) < requests:
            payload = payloads[index % len(payloads)]
            start = time.perf_counter()
            async with session.post(url, data=payload, headers=headers) as response:
                body = await response.read()
            result.latencies_ms.append((time.perf_counter() - start) * 1000)
            result.statuses[response.status] += 1
            if keep_bodies:
                result.bodies.append((index, response.status, body))
            if on_response is not None:
                on_response(index, response.status, body)

    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        start = time.perf_counter()
        await asyncio.gather(*(client(session) for _ in range(concurrency)))
        result.seconds = time.perf_counter() - start
    return result
