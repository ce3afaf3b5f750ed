"""A worker tells the frontend when its handler ran out of memory while loading
(``ferry.worker.main.out_of_memory``), so a multi-model load can answer 507."""

from __future__ import annotations

import pytest
import torch

from ferry.worker.main import out_of_memory


def _raised_from(cause: BaseException) -> BaseException:
    try:
        try:
            raise cause
        except BaseException as error:
            raise RuntimeError("loading the weights failed") from error
    except RuntimeError as outer:
        return outer


def _raised_while(context: BaseException) -> BaseException:
    try:
        try:
            raise context
        except BaseException:
            raise ValueError("cleaning up failed") from None  # context hidden, still kept
    except ValueError as outer:
        return outer


@pytest.mark.parametrize(
    "error",
    [
        MemoryError("cannot allocate"),
        torch.OutOfMemoryError("CUDA out of memory"),
        _raised_from(MemoryError("cannot allocate")),
        _raised_from(torch.cuda.OutOfMemoryError("CUDA out of memory")),
    ],
)
def test_running_out_of_memory_is_told_apart(error: BaseException) -> None:
    assert out_of_memory(error)


@pytest.mark.parametrize(
    "error",
    [
        RuntimeError("CUDA error: out of memory? no: a device-side assert"),
        ValueError("bad weights"),
        _raised_from(FileNotFoundError("model.pth")),
    ],
)
def test_other_load_errors_are_not(error: BaseException) -> None:
    assert not out_of_memory(error)


def test_an_error_raised_while_handling_one_that_was_counts() -> None:
    assert out_of_memory(_raised_while(MemoryError("cannot allocate")))
