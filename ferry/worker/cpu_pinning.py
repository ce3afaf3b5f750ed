"""Each worker's torch threads on cores of its own (``cpu_pinning``, off by default).

After a silence, torch's second intra-op thread must wake for a handler's first parallel
operation; when the scheduler queues it behind the thread that waits for it, a lone
request pays milliseconds (ResNet-18's input normalisation: 5.6 ms instead of 0.2 ms on
two cores, ``benchmarks/results/low_load.md``). OpenMP threads bound to distinct cores
never queue behind each other. Unpinned workers keep the helper threads off the handler
thread's core instead (``ferry.worker.helper_threads``), which removes most of it.

The frontend hands out cores so that no two live workers share one: the start-up models'
workers split the cores between them, a model registered later splits those still free
between its initial workers; a worker that finds too few free runs unpinned (logged: more
workers than cores, a model added when the others hold every core, or scaled up, its added
workers keeping its thread count). OpenMP binds the handler's thread to the worker's first
core, and threads it starts inherit that: Ferry's own (stage threads, preprocess
processes) take all the worker's cores back.

Off by default, as TorchServe's core pinning is: two servers (or two pods whose containers
see every core) pinning on one machine would pin to the same cores.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping, MutableMapping, Sequence

USER_AFFINITY = ("OMP_PROC_BIND", "OMP_PLACES", "GOMP_CPU_AFFINITY", "KMP_AFFINITY")
"""Variables by which a user pins threads themselves: with any set, Ferry pins nothing."""

PINNED_BY_FERRY = "FERRY_PINNED_CORES"
"""Set in a worker Ferry pinned, so that the worker can drop the binding variables once
torch has read them: processes it starts (a preprocess pool) must not inherit them."""


class CoreAllocator:
    """The cores this server's workers may use, and which ones live workers hold.

    >>> cores = CoreAllocator([0, 1, 2])
    >>> cores.claim(2), cores.claim(2), cores.claim(1)
    ((0, 1), None, (2,))
    >>> cores.release((0, 1)); cores.claim(2)
    (0, 1)
    """

    def __init__(self, cores: Iterable[int]) -> None:
        self._cores = sorted(set(cores))
        self._held: set[int] = set()

    def claim(self, count: int) -> tuple[int, ...] | None:
        """``count`` cores no live worker holds, lowest first; None when fewer are free."""
        free = [core for core in self._cores if core not in self._held]
        if count < 1 or len(free) < count:
            return None
        claimed = tuple(free[:count])
        self._held.update(claimed)
        return claimed

    def release(self, cores: Iterable[int]) -> None:
        self._held.difference_update(cores)

    def free_count(self) -> int:
        return len(self._cores) - len(self._held)


def pinned_threads(free_cores: int, workers: int) -> int | None:
    """Torch threads per worker when ``workers`` about to start are to split
    ``free_cores`` between them, a core each at least; None when there are fewer cores
    than workers (they keep the unpinned split, and those that find no cores run unpinned).

    >>> pinned_threads(8, 2), pinned_threads(2, 3)
    (4, None)
    """
    return free_cores // workers if 0 < workers <= free_cores else None


class CoreClaim:
    """The cores one worker holds, given back once: when it is killed (so that the worker
    replacing it at once finds them free, before the dying process is reaped) or when it
    exits, whichever comes first.

    >>> cores = CoreAllocator([0, 1])
    >>> claim = CoreClaim(cores, cores.claim(2) or ())
    >>> claim.release(); claim.release(); cores.claim(2), cores.claim(1)
    ((0, 1), None)
    """

    def __init__(self, allocator: CoreAllocator, cores: tuple[int, ...]) -> None:
        self.cores = cores
        self._allocator: CoreAllocator | None = allocator

    def release(self) -> None:
        if self._allocator is not None:  # a second release would free another's cores
            self._allocator.release(self.cores)
            self._allocator = None


def user_pins_threads(environ: Mapping[str, str]) -> bool:
    return any(environ.get(name) for name in USER_AFFINITY)


def pinned_environment(cores: Sequence[int]) -> dict[str, str]:
    """What binds a worker's OpenMP threads (torch's intra-op threads) to ``cores``, one
    thread per core.

    >>> pinned_environment((2, 3))
    {'OMP_PLACES': '{2},{3}', 'OMP_PROC_BIND': 'close', 'FERRY_PINNED_CORES': '2,3'}
    """
    return {
        "OMP_PLACES": ",".join(f"{{{core}}}" for core in cores),
        "OMP_PROC_BIND": "close",
        PINNED_BY_FERRY: ",".join(map(str, cores)),
    }


_worker_cores: tuple[int, ...] | None = None
"""In a pinned worker: the cores it was given (its threads may use them all)."""


def forget_pinning(environ: MutableMapping[str, str] = os.environ) -> tuple[int, ...] | None:
    """In a pinned worker, once torch is loaded (OpenMP reads its variables then): drop
    them, so that a process the worker starts does not bind its own OpenMP threads to this
    worker's cores again; the worker's cores, or None when Ferry did not pin it. (What the
    process inherits is the affinity of the thread that starts it: the first core, unless
    that thread was widened with ``spread_over_worker_cores``.)"""
    global _worker_cores
    cores = environ.pop(PINNED_BY_FERRY, None)
    if cores is None:
        return None
    for name in ("OMP_PLACES", "OMP_PROC_BIND"):
        environ.pop(name, None)
    _worker_cores = tuple(int(core) for core in cores.split(","))
    return _worker_cores


def worker_cores() -> tuple[int, ...] | None:
    """The cores of this pinned worker (None: not pinned, or not a worker)."""
    return _worker_cores


def spread_over_worker_cores() -> None:
    """For a thread the worker starts (a stage pipeline's): every core of the worker, not
    only the first, to which OpenMP bound the thread that started it."""
    if _worker_cores is not None:
        os.sched_setaffinity(0, _worker_cores)
