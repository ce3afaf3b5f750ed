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

from collections.abc import Iterable


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
