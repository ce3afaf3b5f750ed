"""Torch's helper threads kept off the core of the thread that wakes them (unpinned workers).

A handler's first parallel torch operation after a silence wakes torch's sleeping intra-op
threads (OpenMP's helpers). Some schedulers put a woken thread on the core of the thread
that woke it even while another core idles: on this project's 2-core virtual machines, in
154 of 200 wake-ups in a bare process, traced. The helper then waits behind the handler's
thread, which spins at the operation's barrier waiting for it, and the two take turns on
one core, a scheduler tick each, until the idle core pulls one over: up to 38 ms for a
ResNet-18 request that takes 16 (``benchmarks/results/low_load.md``).

Unless Ferry pinned the worker (``cpu_pinning``) or the user set an OpenMP binding, before
each batch, and before each micro-batch's inference in a stage pipeline, the worker takes
the core its handler's thread is on out of the helpers' allowed cores, so that a woken
helper goes to another. Nothing is bound for good: the helpers keep every other core the
worker may use (on two cores, the other one, until the handler's thread moves), and the
handler's thread keeps all of them, so the scheduler can still move it. Threads that
start teams of their own (a pipeline's preprocess threads) are left alone.

Ferry runs no torch operation of its own to find the helpers: a team it started would
hang any child the handler forks before its own first parallel operation (GNU OpenMP is
not fork-safe). The helpers are the threads not started from Python that appeared while
the handler loaded (a warm-up, or loading weights, starts torch's team), else those that
the handler's thread starts in its own work: a batch, or in a stage pipeline a
micro-batch's inference, which runs alone until the helpers are found (the stage
threads start teams of their own). Until torch's whole team is found, each such work
adds the threads it started, up to ``SEARCHES`` works.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import threading
from collections.abc import Callable, Iterator, Set
from dataclasses import dataclass
from typing import Protocol, cast

log = logging.getLogger("ferry.worker")


SEARCHES = 100
"""The handler thread's works searched for torch's helpers before the search stops (its
team grows with the first operations large enough to use more threads)."""


class ThreadControls(Protocol):
    """What the placement asks of the operating system and torch (a fake in tests)."""

    def current_core(self) -> int: ...

    def allowed_cores(self) -> Set[int]: ...

    def live_threads(self) -> Set[int]: ...

    def python_threads(self) -> Set[int]: ...

    def torch_threads(self) -> int: ...

    def set_affinity(self, thread_id: int, cores: Set[int]) -> None: ...


@dataclass
class _Work:
    threads_before: Set[int] | None
    """This process's threads when the work began; None when it searches nothing."""
    nested: bool = False
    """A work inside it searched or placed (a pipeline's inference inside its batch)."""


class HelperPlacement:
    """Finds torch's helper threads in the handler thread's work, then moves them off that
    thread's core before each of its later works."""

    def __init__(
        self, team_size: int, controls: ThreadControls, found: Set[int] = frozenset()
    ) -> None:
        self.helpers: list[int] = sorted(found)
        """Found so far (those started while the handler loaded, if any)."""
        self.searching = len(found) < team_size - 1
        self._team_size = team_size
        """Torch's thread count when the worker set it: its helpers are one fewer."""
        self._controls = controls
        self._searches_left = SEARCHES
        self._works: list[_Work] = []
        self._placed_for: int | None = None  # no system call while the core stays

    def begin_work(self, search: bool = True) -> None:
        """Before the handler's thread runs torch work: the helpers off its core once they
        are known; until then, this process's threads (if ``search``: nothing else starts
        threads during the work)."""
        if self._works:
            self._works[-1].nested = True
        work = _Work(None)
        self._works.append(work)
        try:
            if self.searching and search:
                work.threads_before = self._controls.live_threads()
            self._keep_helpers_off_current_core()
        except Exception as error:  # a faster lone request must never cost a batch
            self._give_up(f"{type(error).__name__}: {error}")

    def end_work(self) -> None:
        """After that work: while searching, the threads it started are the helpers."""
        work = self._works.pop()
        if not self.searching or work.threads_before is None or work.nested:
            return
        try:
            started = self._controls.live_threads() - work.threads_before
            helpers = started - self._controls.python_threads()
        except Exception as error:
            self._give_up(f"{type(error).__name__}: {error}")
            return
        if helpers:
            self.helpers = sorted({*self.helpers, *helpers})
            self._placed_for = None  # the new ones are placed at the next work
            log.debug("torch helper threads %s kept off the handler thread's core", self.helpers)
        self._searches_left -= 1
        if len(self.helpers) >= self._team_size - 1 or self._searches_left == 0:
            self.searching = False

    def _keep_helpers_off_current_core(self) -> None:
        if not self.helpers:
            return
        core = self._controls.current_core()
        if core == self._placed_for:
            return
        if self._controls.torch_threads() != self._team_size:
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
        # The kernel moves any thread of the user's by its id: one whose helper exited may
        # since belong to another process. Only this process's threads are moved.
        live = self._controls.live_threads()
        self.helpers = [tid for tid in self.helpers if tid in live]
        for tid in list(self.helpers):
            try:
                self._controls.set_affinity(tid, allowed - {core})
            except ProcessLookupError:
                self.helpers.remove(tid)
        self._placed_for = core

    def _give_up(self, reason: str) -> None:
        """Every core back to the helpers, and no more search or moves."""
        log.info("torch helper threads left where the scheduler puts them: %s", reason)
        helpers, self.helpers, self.searching = self.helpers, [], False
        if not helpers:
            return
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
        return _process_threads()

    def python_threads(self) -> Set[int]:
        return {thread.native_id for thread in threading.enumerate() if thread.native_id}

    def torch_threads(self) -> int:
        import torch

        return int(torch.get_num_threads())

    def set_affinity(self, thread_id: int, cores: Set[int]) -> None:
        os.sched_setaffinity(thread_id, cores)


def _libc_sched_getcpu() -> Callable[[], int] | None:
    try:
        function = ctypes.CDLL(None).sched_getcpu
    except (AttributeError, OSError):
        return None
    function.restype = ctypes.c_int
    function.argtypes = []
    return cast(Callable[[], int], function)


def _process_threads() -> set[int]:
    """This process's threads (raises OSError where ``/proc`` is missing)."""
    return {int(tid) for tid in os.listdir("/proc/self/task")}


def threads_before_load() -> Set[int] | None:
    """This process's threads before the handler loads (None without ``/proc``)."""
    try:
        return _process_threads()
    except OSError:
        return None


def helper_placement(before_load: Set[int] | None) -> HelperPlacement | None:
    """For an unpinned worker whose handler just loaded (``before_load``: its threads
    before): torch's helpers, those the load started and those still to be found, and
    their placement; None where there is nothing to place (one torch thread or core, no
    ``sched_getcpu`` or ``/proc``, not Linux)."""
    import torch

    threads = int(torch.get_num_threads())
    if before_load is None or threads < 2 or not hasattr(os, "sched_setaffinity"):
        return None
    current_core = _libc_sched_getcpu()
    if current_core is None or len(os.sched_getaffinity(0)) < 2:
        return None
    controls = LinuxThreadControls(current_core)
    try:
        started = controls.live_threads() - before_load - controls.python_threads()
    except OSError:
        return None
    return HelperPlacement(threads, controls, started)


def seeking_helpers() -> bool:
    """Whether the calling thread's works are still searched for torch's helpers (a stage
    pipeline then runs one micro-batch at a time, its stage threads idle)."""
    placement = _this_threads_placement()
    return placement is not None and placement.searching


_placements: dict[int, HelperPlacement] = {}
"""By handler thread: a worker's one; a process hosting several models runs all their
handler code on one thread (``ferry.worker.host``), whose first placement stays."""


def install(placement: HelperPlacement | None) -> None:
    """Make ``placement`` the calling thread's (the handler's), unless it has one."""
    if placement is not None:
        _placements.setdefault(threading.get_ident(), placement)


def forget_placement() -> None:
    """The calling thread has no placement any more."""
    _placements.pop(threading.get_ident(), None)


def _this_threads_placement() -> HelperPlacement | None:
    return _placements.get(threading.get_ident())


@contextlib.contextmanager
def handler_thread_work(search: bool = True) -> Iterator[None]:
    """Around the handler thread's torch work: the helpers off its current core, or found
    among the threads the work starts (``search=False`` where other threads may start some
    meanwhile). Nothing in any other thread, or in a worker without a placement."""
    placement = _this_threads_placement()
    if placement is None:
        yield
        return
    try:
        placement.begin_work(search)  # its first step cannot fail: end_work always pairs
        yield
    finally:
        placement.end_work()
