"""Torch's helper threads kept off the core of the thread that wakes them (unpinned workers).

A handler's first parallel torch operation after a silence wakes torch's sleeping intra-op
threads (OpenMP's helpers). Some schedulers put a woken thread on the core of the thread
that woke it even while another core idles: on this project's 2-core virtual machines, in
154 of 200 wake-ups in a bare process, traced. The helper then waits behind the handler's
thread, which spins at the operation's barrier waiting for it, and the two take turns on
one core, a scheduler tick each, until the idle core pulls one over: up to 38 ms for a
ResNet-18 request that takes 16 (``benchmarks/results/low_load.md``).

Unless the worker is pinned (``cpu_pinning``, or the user's own OpenMP binding), before
each batch, and before each micro-batch's inference in a stage pipeline, the worker takes
the core its handler's thread is on out of the helpers' allowed cores, so that a woken
helper goes to another. Nothing is bound for good: the helpers keep every other core the
worker may use (on two cores, the other one, until the handler's thread moves), and the
handler's thread keeps all of them, so the scheduler can still move it. Threads that
start teams of their own (a pipeline's preprocess threads) are left alone.

The helpers are found once the handler has loaded, not before: a team started before the
handler's ``initialize`` would hang a child the handler forks there at its first parallel
operation (GNU OpenMP is not fork-safe).
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import threading
from collections.abc import Callable, Collection, Set
from typing import Protocol, cast

log = logging.getLogger("ferry.worker")


class ThreadControls(Protocol):
    """What the placement asks of the operating system and torch (a fake in tests)."""

    def current_core(self) -> int: ...

    def allowed_cores(self) -> Set[int]: ...

    def live_threads(self) -> Set[int]: ...

    def torch_threads(self) -> int: ...

    def set_affinity(self, thread_id: int, cores: Set[int]) -> None: ...


class HelperPlacement:
    """Moves the helper threads ``helpers`` (thread ids) off the calling thread's core."""

    def __init__(self, helpers: Collection[int], threads: int, controls: ThreadControls) -> None:
        self.helpers = sorted(helpers)
        self._threads = threads
        self._controls = controls
        self._placed_for: int | None = None  # no system call while the core stays

    def before_parallel_work(self) -> None:
        """Take the calling thread's core out of the helpers' cores, if it changed."""
        if not self.helpers:
            return
        core = self._controls.current_core()
        if core == self._placed_for:
            return
        if self._controls.torch_threads() != self._threads:
            # The handler resized torch's team: these are no longer all of its helpers.
            self._give_up("torch's thread count changed")
            return
        try:
            self._move_helpers(core)
        except OSError as error:  # not permitted, or the worker's cores changed
            self._give_up(str(error))

    def _move_helpers(self, core: int) -> None:
        allowed = self._controls.allowed_cores()
        if len(allowed) < 2:
            return
        # A thread id that left this process may be reused by a thread that is no helper.
        live = self._controls.live_threads()
        self.helpers = [tid for tid in self.helpers if tid in live]
        for tid in list(self.helpers):
            try:
                self._controls.set_affinity(tid, allowed - {core})
            except ProcessLookupError:
                self.helpers.remove(tid)
        self._placed_for = core

    def _give_up(self, reason: str) -> None:
        """Every core back to the helpers, and no more moves."""
        log.info("torch helper threads left where the scheduler puts them: %s", reason)
        helpers, self.helpers = self.helpers, []
        try:
            allowed = self._controls.allowed_cores()
        except OSError:
            return  # the worker's cores cannot be read: nothing more to undo
        for tid in helpers:
            with contextlib.suppress(OSError):  # gone, or not ours to move
                self._controls.set_affinity(tid, allowed)


class LinuxThreadControls:
    """The real thing: ``sched_getcpu`` from libc, affinities, ``/proc/self/task``, torch."""

    def __init__(self, sched_getcpu: Callable[[], int]) -> None:
        self._sched_getcpu = sched_getcpu

    def current_core(self) -> int:
        return self._sched_getcpu()

    def allowed_cores(self) -> Set[int]:
        return os.sched_getaffinity(0)

    def live_threads(self) -> Set[int]:
        return thread_ids()

    def torch_threads(self) -> int:
        import torch

        return int(torch.get_num_threads())

    def set_affinity(self, thread_id: int, cores: Set[int]) -> None:
        os.sched_setaffinity(thread_id, cores)


def thread_ids() -> set[int]:
    """This process's threads (raises OSError where ``/proc`` is missing)."""
    return {int(tid) for tid in os.listdir("/proc/self/task")}


def threads_before_load() -> set[int] | None:
    """The threads before the handler loads (torch's own import threads among them)."""
    try:
        return thread_ids()
    except OSError:
        return None


def _libc_sched_getcpu() -> Callable[[], int] | None:
    try:
        function = ctypes.CDLL(None).sched_getcpu
    except (AttributeError, OSError):
        return None
    function.restype = ctypes.c_int
    function.argtypes = []
    return cast(Callable[[], int], function)


def find_helpers(before: Set[int]) -> set[int]:
    """After the handler loaded: run one parallel torch operation, so that torch's team
    exists, and the threads started since ``before`` that Python does not know: the
    helpers (native threads the handler started, if any, among them: moving those off one
    core is harmless)."""
    import torch

    # Large enough for torch to split it over the intra-op threads (its grain: 32768).
    torch.ones(torch.get_num_threads() * 65536).add_(1)
    python_threads = {thread.native_id for thread in threading.enumerate()}
    return thread_ids() - set(before) - python_threads


def helper_placement(before: Set[int] | None) -> HelperPlacement | None:
    """For an unpinned worker whose handler just loaded (``before``: its threads before):
    the placement of torch's helpers, or None where there is nothing to place (one torch
    thread or core, no ``sched_getcpu`` or ``/proc``, not Linux)."""
    import torch

    threads = int(torch.get_num_threads())
    if before is None or threads < 2 or not hasattr(os, "sched_setaffinity"):
        return None
    current_core = _libc_sched_getcpu()
    if current_core is None or len(os.sched_getaffinity(0)) < 2:
        return None
    try:
        helpers = find_helpers(before)
    except OSError:
        return None
    if not helpers:
        return None
    log.debug("torch helper threads %s kept off the handler thread's core", sorted(helpers))
    return HelperPlacement(helpers, threads, LinuxThreadControls(current_core))


_placement: HelperPlacement | None = None
_placing_thread: int | None = None


def install(placement: HelperPlacement | None) -> None:
    """Make ``placement`` this worker's, for the calling thread (the handler's)."""
    global _placement, _placing_thread
    _placement = placement
    _placing_thread = threading.get_ident()


def keep_helpers_off_this_core() -> None:
    """Before the handler's thread runs torch work: the helpers off its current core (a
    no-op in any other thread, and in a worker without a placement)."""
    if _placement is not None and threading.get_ident() == _placing_thread:
        _placement.before_parallel_work()
