"""Batch transform's ``GET /execution-parameters``, derived from a model's settings."""

from __future__ import annotations

import doctest

import pytest

from ferry.http import sagemaker
from ferry.http.sagemaker import execution_parameters
from ferry.service.status import ModelStatus


def _status(min_workers: int, max_workers: int, batch_size: int) -> ModelStatus:
    return ModelStatus(
        "m", "1.0", "", min_workers, max_workers, batch_size, 100, 60, True, [], 100, 0, True, ""
    )


def test_the_documented_example() -> None:
    assert doctest.testmod(sagemaker).failed == 0


@pytest.mark.parametrize(
    ("workers", "batch_size", "request_size", "expected"),
    [
        ((1, 1), 1, 6_553_500, (1, 6)),  # the toolkit's defaults: one at a time
        ((2, 4), 8, 6_553_500, (16, 6)),  # 4 x 8 = 32 at once, but 16 x 6 MB fits 100 MB
        ((1, 1), 4, 200 << 20, (1, 100)),  # payloads beyond SageMaker's 100 MB: 100
        ((1, 1), 2, 1000, (2, 1)),  # under a MB: 1
        ((3, 0), 2, 6 << 20, (6, 6)),  # no maxWorkers: the workers Ferry keeps
    ],
)
def test_concurrency_is_what_the_workers_take_within_100_mb(
    workers: tuple[int, int], batch_size: int, request_size: int, expected: tuple[int, int]
) -> None:
    document = execution_parameters(_status(*workers, batch_size), request_size)
    assert (document["MaxConcurrentTransforms"], document["MaxPayloadInMB"]) == expected
    assert document["BatchStrategy"] == "SINGLE_RECORD"
