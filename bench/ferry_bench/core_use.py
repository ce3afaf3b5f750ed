"""Who used the machine's cores while a load ran: the load generator (this process), the
server under test (its main process and its workers, when started here) and everything
else on the cores this process may run on.

A limit report's ceiling X* is the model's on every core. When the load generator and the
server share a machine, part of those cores serve the load generator instead: these
figures say how much, per offered load, so that a miss near the ceiling can be told apart
from a server that wastes the cores.
"""

from __future__ import annotations

import resource
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass, field

from ferry.config.settings import usable_cpus
from ferry.procinfo import cpu_jiffies, descendants, process_times


def own_cpu_seconds() -> float:
    """This process's user + system CPU seconds, every thread."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


@dataclass(frozen=True)
class CpuSnapshot:
    at_s: float
    host_busy: int
    """Busy CPU time since boot on the usable CPUs, in clock ticks, all together."""
    host_total: int
    generator_s: float
    """The load generator's own CPU seconds."""
    server_main_s: float | None = None
    """The server's main process's own CPU seconds (None: no server process known)."""
    server_tree_s: float | None = None
    """The CPU seconds of the server's main process and every descendant, each with the
    children it has reaped: a worker that ends and is waited for still counts."""


@dataclass(frozen=True)
class CoreUse:
    cores: int
    cores_busy: float
    """Busy cores, on average over the run: everything that ran on them."""
    generator_cores: float
    """The cores the load generator used, on average over the run."""
    generator_ms: float | None
    """The load generator's CPU ms per answered request (None: nothing was answered)."""
    server_main_ms: float | None
    """The server's main process's CPU ms per answered request (None: not known)."""
    server_workers_ms: float | None
    """The rest of the server's processes (its workers), CPU ms per answered request."""


Times = tuple[float, float]
"""A process's own CPU seconds and its reaped children's."""


@dataclass
class CoreClock:
    """Snapshots of CPU time, read from /proc unless told otherwise (tests give fakes)."""

    server_pid: int | None = None
    cpus: frozenset[int] = field(default_factory=usable_cpus)
    clock: Callable[[], float] = time.monotonic
    host: Callable[[Collection[int]], tuple[int, int]] = cpu_jiffies
    own: Callable[[], float] = own_cpu_seconds
    process: Callable[[int], Times | None] = process_times
    children: Callable[[int], list[int]] = descendants

    @property
    def cores(self) -> int:
        return len(self.cpus)

    def snapshot(self) -> CpuSnapshot:
        busy, total = self.host(self.cpus)
        now, generator = self.clock(), self.own()
        main = None if self.server_pid is None else self.process(self.server_pid)
        if self.server_pid is None or main is None:
            return CpuSnapshot(now, busy, total, generator)
        tree = sum(main)
        for child in self.children(self.server_pid):
            times = self.process(child)
            if times is not None:  # else it ended as we read: its parent reaps its time
                tree += sum(times)
        return CpuSnapshot(now, busy, total, generator, main[0], tree)

    def between(self, before: CpuSnapshot, after: CpuSnapshot, answered: int) -> CoreUse:
        """What was used from ``before`` to ``after``, per answered request."""
        per_request = None if answered <= 0 else 1000 / answered
        ticks = after.host_total - before.host_total
        busy = self.cores * (after.host_busy - before.host_busy) / ticks if ticks > 0 else 0.0
        generator_s = after.generator_s - before.generator_s
        wall_s = after.at_s - before.at_s
        main = workers = None
        server = _server_seconds(before, after)
        if server is not None and per_request is not None:
            main, workers = server[0] * per_request, server[1] * per_request
        return CoreUse(
            cores=self.cores,
            cores_busy=busy,
            generator_cores=generator_s / wall_s if wall_s > 0 else 0.0,
            generator_ms=None if per_request is None else generator_s * per_request,
            server_main_ms=main,
            server_workers_ms=workers,
        )


def _server_seconds(before: CpuSnapshot, after: CpuSnapshot) -> tuple[float, float] | None:
    """The server's main process's CPU seconds between the snapshots, and the rest of its
    processes' (None: not measured in both)."""
    if (
        before.server_main_s is None
        or after.server_main_s is None
        or before.server_tree_s is None
        or after.server_tree_s is None
    ):
        return None
    main = after.server_main_s - before.server_main_s
    return main, after.server_tree_s - before.server_tree_s - main
