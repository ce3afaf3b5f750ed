"""Sticky GPU errors: recognised in a handler's exception (or its causes), answered
without retries, and the worker told to go."""

from __future__ import annotations

from typing import Any

import pytest

from ferry.handlers.contract.context import Context
from ferry.wire.messages import InputPart, PredictBatch, RequestItem
from ferry.worker.device_failure import unrecoverable_device_error
from ferry.worker.runner import BatchRunner

ASSERT = "CUDA error: device-side assert triggered\nCUDA kernel errors might be reported later"


@pytest.mark.parametrize(
    ("error", "expected"),
    [
        (RuntimeError(ASSERT), "CUDA error: device-side assert triggered"),
        (
            RuntimeError("CUDA error: an illegal memory access was encountered"),
            "CUDA error: an illegal memory access was encountered",
        ),
        (
            RuntimeError("CUDA error: CUBLAS_STATUS_EXECUTION_FAILED when calling cublasSgemm"),
            "CUDA error: CUBLAS_STATUS_EXECUTION_FAILED when calling cublasSgemm",
        ),
        (RuntimeError("CUDA out of memory. Tried to allocate 20.00 GiB"), None),
        # A CPU extension's own words, no CUDA in sight: not the GPU's.
        (RuntimeError("illegal memory access at 0x0 in my_extension"), None),
        (ValueError("expected a JSON list"), None),
    ],
)
def test_sticky_errors_are_told_from_others(error: Exception, expected: str | None) -> None:
    assert unrecoverable_device_error(error) == expected


def test_a_sticky_error_is_found_among_the_causes() -> None:
    try:
        try:
            raise RuntimeError(ASSERT)
        except RuntimeError as inner:
            raise ValueError("postprocess failed") from inner
    except ValueError as outer:
        assert unrecoverable_device_error(outer) == "CUDA error: device-side assert triggered"


def _batch(*bodies: bytes) -> PredictBatch:
    items = [
        RequestItem(f"r{i}", {}, [InputPart("body", "text/plain", body)])
        for i, body in enumerate(bodies)
    ]
    return PredictBatch(1, items)


def _runner(entry: Any) -> BatchRunner:
    return BatchRunner(entry, Context("m", ".", {"model": {}}, 4, None))


def test_a_batch_that_faults_the_gpu_is_answered_without_retries() -> None:
    calls: list[int] = []

    def faulting(rows: list[Any], context: Context) -> list[Any]:
        calls.append(len(rows))
        raise RuntimeError(ASSERT)

    runner = _runner(faulting)
    result = runner.run(_batch(b"a", b"b", b"c"))
    assert calls == [3]  # no one-by-one retry on a context every call now fails in
    assert runner.device_failed == "CUDA error: device-side assert triggered"
    messages = {item.message for item in result.results}
    assert messages == {
        "RuntimeError: the GPU failed (CUDA error: device-side assert triggered); "
        "the worker is replaced"
    }


def test_a_micro_batch_that_faulted_marks_the_worker_too() -> None:
    """The stage pipeline answers a failed micro-batch's rows with its exception."""

    def pipelined(rows: list[Any], context: Context) -> list[Any]:
        return ["fine", RuntimeError(ASSERT)]

    runner = _runner(pipelined)
    result = runner.run(_batch(b"a", b"b"))
    assert result.results[0].body == b"fine"
    assert "the GPU failed" in result.results[1].message
    assert runner.device_failed is not None


def test_an_ordinary_failure_keeps_the_worker() -> None:
    def failing(rows: list[Any], context: Context) -> list[Any]:
        raise ValueError("bad input")

    runner = _runner(failing)
    runner.run(_batch(b"a", b"b"))
    assert runner.device_failed is None
