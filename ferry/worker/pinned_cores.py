"""In a worker the frontend pinned (``cpu_pinning``): its cores, and the binding variables
dropped once torch has read them (``ferry.worker_handles.core_allocation`` says why)."""

from __future__ import annotations

import os
from collections.abc import MutableMapping

from ferry.wire.environment import PINNED_BY_FERRY

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
