"""``micro_batching: {pool: process}``: preprocess in spawned processes, in order, with
errors and dead processes failing only their micro-batch."""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Iterator
from typing import Any

import pytest
import torch

from ferry.handlers.builtin.base_handler import BaseHandler
from ferry.handlers.contract.exceptions import PredictionException
from ferry.worker import pinned_cores
from ferry.worker.pipeline import PipelineSettings, StagePipeline
from ferry.worker.preprocess_processes import PreprocessProcessDied
from tests.fixtures.handler_inputs import batch_context


class PidHandler(BaseHandler):
    """Pure-Python preprocessing that reports the process it ran in."""

    def preprocess(self, data: list[dict[str, Any]]) -> torch.Tensor:
        values = [row["body"] for row in data]
        if "die" in values:
            os._exit(3)
        if "bad" in values:
            raise PredictionException("bad row", 422)
        return torch.tensor([[float(v), float(os.getpid())] for v in values])

    def inference(self, data: Any, *args: Any, **kwargs: Any) -> Any:
        return data

    def postprocess(self, data: Any) -> list[Any]:
        return [(int(value), int(pid)) for value, pid in data.tolist()]


class AffinityHandler(PidHandler):
    """Reports on how many cores the process that ran its preprocess may run."""

    def preprocess(self, data: list[dict[str, Any]]) -> torch.Tensor:
        return torch.tensor([[float(len(os.sched_getaffinity(0))), 0.0] for _ in data])


class LockedHandler(PidHandler):
    def __init__(self) -> None:
        super().__init__()
        self.lock = threading.Lock()  # cannot be copied into a process


@pytest.fixture(scope="module")
def pipeline() -> Iterator[StagePipeline]:
    stages = StagePipeline(PidHandler(), PipelineSettings(2, 2, 1, preprocess_in_processes=True))
    yield stages
    stages.close()


def test_preprocess_runs_in_other_processes_and_results_keep_their_order(
    pipeline: StagePipeline,
) -> None:
    results = pipeline.handle([{"body": i} for i in range(11)], batch_context(11))
    assert [value for value, _ in results] == list(range(11))
    assert os.getpid() not in {pid for _, pid in results}


def test_errors_and_a_dead_process_fail_only_their_micro_batch(pipeline: StagePipeline) -> None:
    rows = [{"body": v} for v in (1, 2, "bad", 4, 5, 6)]
    results = pipeline.handle(rows, batch_context(6))
    assert [r[0] for r in results[:2] + results[4:]] == [1, 2, 5, 6]
    assert all(isinstance(r, PredictionException) and r.error_code == 422 for r in results[2:4])

    rows = [{"body": v} for v in (1, 2, "die", 4)]
    results = pipeline.handle(rows, batch_context(4))
    assert all(isinstance(r, PreprocessProcessDied) for r in results[2:4])
    # The pool was started afresh: the next batch is answered in full.
    again = pipeline.handle([{"body": i} for i in range(4)], batch_context(4))
    assert [value for value, _ in again] == [0, 1, 2, 3]


def test_a_handler_that_cannot_be_copied_keeps_threads(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, "ferry.worker"):
        stages = StagePipeline(LockedHandler(), PipelineSettings(2, 2, 1, True))
    assert "using threads" in caplog.text
    results = stages.handle([{"body": i} for i in range(3)], batch_context(3))
    stages.close()
    assert results == [(i, os.getpid()) for i in range(3)]


def test_with_cpu_pinning_children_use_every_core_of_the_worker() -> None:
    """A pinned worker's main thread is bound to its first core, and a spawned child
    inherits that: the pool's children take all the worker's cores back."""
    cores = tuple(sorted(os.sched_getaffinity(0)))
    pinned_cores._worker_cores = cores
    os.sched_setaffinity(0, cores[:1])  # this thread, as OpenMP binds a worker's
    try:
        settings = PipelineSettings(2, 1, 1, preprocess_in_processes=True)
        stages = StagePipeline(AffinityHandler(), settings)
        try:
            results = stages.handle([{"body": i} for i in range(4)], batch_context(4))
        finally:
            stages.close()
    finally:
        os.sched_setaffinity(0, cores)
        pinned_cores._worker_cores = None
    assert [count for count, _ in results] == [len(cores)] * 4
