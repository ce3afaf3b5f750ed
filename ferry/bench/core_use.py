"""Who used the machine's cores while a load ran: the load generator (this process), the
server under test (its main process and its workers, when started here) and the host.

A limit report's ceiling X* is the model's on every core. When the load generator and the
server share a machine, part of those cores serve the load generator instead: these
figures say how much, per offered load, so that a miss near the ceiling can be told apart
from a server that wastes the cores.
"""

from __future__ import annotations

import os
import resource
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from ferry.procinfo import cpu_jiffies, cpu_seconds, descendants


def own_cpu_seconds() -> float:
    """This process's user + system CPU seconds, every thread."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


@dataclass(frozen=True)
class CpuSnapshot:
    at_s: float
    host_busy: int
    """The host's busy CPU time since boot, in clock ticks, all cores together."""
    host_total: int
    generator_s: float
    """The load generator's own CPU seconds."""
    server_main_s: float | None = None
    """The server's main process's CPU seconds (None: no server process known)."""
    server_workers_s: dict[int, float] = field(default_factory=dict)
    """Each of its descendant processes' CPU seconds, by pid."""


@dataclass(frozen=True)
class CoreUse:
    cores: int
    cores_busy: float
    """The host's busy cores, on average over the run."""
    generator_cores: float
    """The cores the load generator used, on average over the run."""
    generator_ms: float
    """The load generator's CPU ms per answered request."""
    server_main_ms: float | None
    """The server's main process's CPU ms per answered request (None: not known)."""
    server_workers_ms: float | None
    """Its workers' CPU ms per answered request (None: not known)."""


@dataclass
class CoreClock:
    """Snapshots of CPU time, read from /proc unless told otherwise (tests give fakes)."""

    server_pid: int | None = None
    cores: int = field(default_factory=lambda: os.cpu_count() or 1)
    clock: Callable[[], float] = time.monotonic
    host: Callable[[], tuple[int, int]] = cpu_jiffies
    own: Callable[[], float] = own_cpu_seconds
    process: Callable[[int], float] = cpu_seconds
    children: Callable[[int], list[int]] = descendants

    def snapshot(self) -> CpuSnapshot:
        busy, total = self.host()
        now, generator = self.clock(), self.own()
        if self.server_pid is None:
            return CpuSnapshot(now, busy, total, generator)
        workers = {pid: self.process(pid) for pid in self.children(self.server_pid)}
        return CpuSnapshot(now, busy, total, generator, self.process(self.server_pid), workers)

    def between(self, before: CpuSnapshot, after: CpuSnapshot, answered: int) -> CoreUse:
        """What was used from ``before`` to ``after``, per answered request. A worker that
        started in between counts from zero; one that ended in between is not counted."""
        per_request_ms = 1000 / max(answered, 1)
        ticks = after.host_total - before.host_total
        busy = self.cores * (after.host_busy - before.host_busy) / ticks if ticks > 0 else 0.0
        generator_s = after.generator_s - before.generator_s
        wall_s = after.at_s - before.at_s
        main = workers = None
        if before.server_main_s is not None and after.server_main_s is not None:
            main = (after.server_main_s - before.server_main_s) * per_request_ms
            workers = per_request_ms * sum(
                seconds - before.server_workers_s.get(pid, 0.0)
                for pid, seconds in after.server_workers_s.items()
            )
        return CoreUse(
            cores=self.cores,
            cores_busy=busy,
            generator_cores=generator_s / wall_s if wall_s > 0 else 0.0,
            generator_ms=generator_s * per_request_ms,
            server_main_ms=main,
            server_workers_ms=workers,
        )
