"""GPU placement: round-robin across models, deviceIds, deviceType, number_of_gpu."""

from __future__ import annotations

import logging

import pytest

from ferry.capacity.placement import model_gpus, worker_gpu
from ferry.errors import ConfigError


def test_models_continue_the_round_robin_where_the_last_one_stopped() -> None:
    assert model_gpus(4, None, (), first=0) == (0, 1, 2, 3)
    assert model_gpus(4, None, (), first=1) == (1, 2, 3, 0)
    assert model_gpus(4, "gpu", (), first=6) == (2, 3, 0, 1)


def test_device_ids_pin_a_model_and_must_be_usable() -> None:
    assert model_gpus(4, None, (3, 1), first=2) == (3, 1)
    with pytest.raises(ConfigError, match=r"deviceIds \[2\] are not usable GPUs"):
        model_gpus(2, None, (0, 2), first=0)  # e.g. number_of_gpu=2


def test_cpu_when_asked_or_when_there_is_no_gpu(caplog: pytest.LogCaptureFixture) -> None:
    assert model_gpus(4, "cpu", (0,), first=0) == ()
    assert model_gpus(0, None, (), first=0) == ()
    with caplog.at_level(logging.WARNING, "ferry.scheduling"):
        assert model_gpus(0, "gpu", (), first=0) == ()
    assert "none is usable" in caplog.text


def test_workers_of_a_model_take_its_gpus_in_turn() -> None:
    gpus = model_gpus(2, None, (), first=1)
    assert [worker_gpu(gpus, index) for index in range(4)] == [1, 0, 1, 0]
    assert worker_gpu((), 3) is None
