"""Torch's helper threads kept off the core of the thread that wakes them (unpinned workers).

A handler's first parallel torch operation after a silence wakes torch's sleeping intra-op
threads (OpenMP's helpers). Some schedulers put a woken thread on the core of the thread
that woke it even while another core idles: on this project's 2-core virtual machines 77%
of such wake-ups in a bare process, traced. The helper then waits behind the handler's
thread, which spins at the operation's barrier waiting for it, and the two take turns on
one core, a scheduler tick each, until the idle core pulls one over: up to 37 ms for a
ResNet-18 request that takes 16 (``benchmarks/results/low_load.md``).

Unless the worker is pinned (``cpu_pinning``, or the user's own OpenMP binding), before each
batch the worker takes the core its handler's thread is on out of the helpers' allowed
cores, so that a woken helper goes to another. Nothing is pinned: the helpers keep every
other core the worker may use, and the handler's thread keeps all of them. Only the team
of the worker's main thread is moved; a stage pipeline's threads start teams of their own.
"""

from __future__ import annotations

import ctypes
import logging
import os
from collections.abc import Callable, Collection, Set

log = logging.getLogger("ferry.worker")

SetAffinity = Callable[[int, Set[int]], None]


class HelperPlacement:
    """Moves the helper threads ``helpers`` (thread ids) off the handler thread's core.

    >>> moves = []
    >>> cores = iter([1, 1, 0])
    >>> placement = HelperPlacement([7], {0, 1, 2}, lambda: next(cores),
    ...                             lambda tid, allowed: moves.append((tid, sorted(allowed))))
    >>> placement.before_batch(); placement.before_batch(); placement.before_batch()
    >>> moves
    [(7, [0, 2]), (7, [1, 2])]
    """

    def __init__(
        self,
        helpers: Collection[int],
        allowed: Set[int],
        current_core: Callable[[], int],
        set_affinity: SetAffinity,
    ) -> None:
        self.helpers = list(helpers)
        self._allowed = frozenset(allowed)
        self._current_core = current_core
        self._set_affinity = set_affinity
        self._placed_for: int | None = None
        """The core the helpers were last moved off (no system call while it stays)."""

    @property
    def active(self) -> bool:
        return bool(self.helpers)

    def before_batch(self) -> None:
        """Take the calling thread's core out of the helpers' cores, if it changed."""
        if not self.helpers:
            return
        core = self._current_core()
        if core == self._placed_for:
            return
        others = self._allowed - {core}
        for tid in list(self.helpers):
            try:
                self._set_affinity(tid, others)
            except ProcessLookupError:  # the thread has exited
                self.helpers.remove(tid)
            except OSError as error:  # the worker's cores changed under it: stop moving
                log.info("torch helper threads left where the scheduler puts them: %s", error)
                self.helpers = []
                return
        self._placed_for = core


def native_thread_ids() -> set[int]:
    return {int(tid) for tid in os.listdir("/proc/self/task")}


def start_helpers(threads: int) -> set[int]:
    """Run one parallel torch operation so that OpenMP starts this thread's team of
    ``threads``; the thread ids of the helpers it started (none when the team existed)."""
    import torch

    before = native_thread_ids()
    # Large enough for torch to split it over the intra-op threads (its grain: 32768).
    torch.ones(threads * 65536).add_(1)
    return native_thread_ids() - before


def _libc_current_core() -> Callable[[], int] | None:
    try:
        function = ctypes.CDLL(None).sched_getcpu
    except (AttributeError, OSError):
        return None
    function.restype = ctypes.c_int
    function.argtypes = []

    def current_core() -> int:
        return int(function())

    return current_core


def helper_placement(threads: int) -> HelperPlacement | None:
    """For an unpinned worker with ``threads`` intra-op threads, called before its handler
    loads: the placement of its helpers, or None where there is nothing to place (one
    thread or core, no ``sched_getcpu``, not Linux)."""
    if threads < 2 or not hasattr(os, "sched_setaffinity"):
        return None
    allowed = os.sched_getaffinity(0)
    current_core = _libc_current_core()
    if len(allowed) < 2 or current_core is None:
        return None
    helpers = start_helpers(threads)
    if not helpers:
        return None
    log.debug("torch helper threads %s kept off the handler thread's core", sorted(helpers))
    return HelperPlacement(helpers, allowed, current_core, os.sched_setaffinity)
