"""Preprocess in child processes, for handlers whose preprocessing holds the GIL.

PIL decoding and torch ops release the GIL, so threads are the default; pure-Python
preprocessing (parsing, tokenising, per-pixel Python) does not, and only processes run it
in parallel. With ``micro_batching: {pool: process}`` each preprocess thread hands its
micro-batch to one of ``parallelism.preprocess`` spawned processes, each holding a copy of
the handler without its model (``BaseHandler.__getstate__``), and uploads the result to
the device itself, so children never touch the GPU.

When a child dies, the pool is started afresh and the micro-batches it held are retried
once; one whose process dies again fails. Children die with the worker.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import pickle
import sys
import threading
import time
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import Any

from ferry.worker.lifetime import die_with_parent, ignore_interrupts
from ferry.worker.pinned_cores import worker_cores

log = logging.getLogger("ferry.worker")

_handler: Any = None
"""The handler copy of this child process."""


def _start_child(state: bytes, import_paths: list[str], cores: tuple[int, ...] | None) -> None:
    global _handler
    die_with_parent()
    ignore_interrupts()
    if cores is not None:  # a pinned worker's: spread over its cores, not its first one
        os.sched_setaffinity(0, cores)
    sys.path[:] = import_paths  # the model folder and the ts shim, as in the worker
    import torch

    torch.set_num_threads(1)  # one core per child: parallelism comes from the children
    _handler = pickle.loads(state)


def _ready() -> int:
    return 0


def _preprocess_in_child(rows: list[Any]) -> tuple[Any, dict[int, Exception], float]:
    start = time.perf_counter()
    batch = _handler.preprocess(rows)
    failures = dict(getattr(_handler, "failures", {}) or {})
    return batch, failures, (time.perf_counter() - start) * 1000


class PreprocessProcessDied(RuntimeError):
    pass


class PreprocessProcesses:
    """A pool of spawned processes running ``handler.preprocess``.

    Raises ``pickle.PicklingError`` / ``TypeError`` at construction when the handler cannot
    be copied into a process.
    """

    def __init__(self, handler: Any, processes: int) -> None:
        self._state = pickle.dumps(handler)
        self._paths = list(sys.path)
        """The import path of the load: a process hosting several models takes the
        model's folder off it afterwards, and a restart must still find the handler."""
        self._processes = processes
        self._lock = threading.Lock()
        self._pool = self._start()

    def _start(self) -> ProcessPoolExecutor:
        pool = ProcessPoolExecutor(
            self._processes,
            mp_context=multiprocessing.get_context("spawn"),
            initializer=_start_child,
            # A child inherits the affinity of the thread that starts it: with cpu_pinning,
            # one core; it takes every core of the worker instead.
            initargs=(self._state, self._paths, worker_cores()),
        )
        # Start the children now rather than on the first batch.
        for future in [pool.submit(_ready) for _ in range(self._processes)]:
            future.result()
        return pool

    def preprocess(self, rows: list[Any]) -> tuple[Any, dict[int, Exception], float]:
        for attempt in (1, 2):
            pool = self._pool
            try:
                return pool.submit(_preprocess_in_child, rows).result()
            except BrokenProcessPool as exc:
                # Every micro-batch in flight sees the break, not only the one that caused
                # it: each is retried once on a fresh pool.
                self._restart(pool)
                if attempt == 2:
                    raise PreprocessProcessDied("a preprocess process died twice") from exc
        raise AssertionError("unreachable")

    def _restart(self, broken: ProcessPoolExecutor) -> None:
        with self._lock:
            if self._pool is broken:  # another thread may have restarted it already
                log.error("a preprocess process died; starting the pool afresh")
                broken.shutdown(wait=False, cancel_futures=True)
                self._pool = self._start()

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
