"""How many workers a model gets by default (one per GPU it runs on), how long they may
take to start, and whether their GPUs can hold them."""

from __future__ import annotations

import pytest

from ferry.capacity.placement import gpu_memory_refusal
from ferry.capacity.sizing import Machine, worker_count
from ferry.config.model_config import ModelConfig
from ferry.config.sections import OptimizationConfig
from ferry.config.settings import ServerSettings
from ferry.scheduling.runner_settings import startup_timeout


@pytest.mark.parametrize(
    ("config", "workers"),
    [
        (ModelConfig(), 8),  # every usable GPU, one worker each
        (ModelConfig(device_ids=(1,)), 1),  # not 8 workers crowding GPU 1
        (ModelConfig(device_ids=(2, 5)), 2),
        (ModelConfig(device_type="cpu"), 1),  # one CPU worker uses every core already
        (ModelConfig(device_type="cpu", min_workers=3), 3),
    ],
)
def test_default_workers_follow_the_models_gpus(config: ModelConfig, workers: int) -> None:
    assert worker_count(config, ServerSettings(), Machine(16, gpus=8)) == workers


def test_the_servers_default_workers_win_over_the_gpu_count() -> None:
    settings = ServerSettings(default_workers_per_model=2)
    assert worker_count(ModelConfig(device_ids=(1,)), settings, Machine(16, gpus=8)) == 2


def test_max_autotune_gets_a_longer_startup_timeout() -> None:
    """Autotuning benchmarks kernels at load: 120 s is not enough for a large model."""
    autotune = ModelConfig(optimization=OptimizationConfig(compile_mode="max-autotune"))
    assert startup_timeout(autotune, None) == 900.0
    assert startup_timeout(ModelConfig(), None) == 120.0
    # What the user set still wins.
    assert startup_timeout(autotune, 60.0) == 60.0
    own = ModelConfig(startup_timeout=300.0, optimization=autotune.optimization)
    assert startup_timeout(own, None) == 300.0


GIB = 1 << 30


def test_workers_that_cannot_hold_their_weights_are_refused_before_they_start() -> None:
    free = {0: 3 * GIB, 1: 8 * GIB}
    # Three workers over GPUs 0 and 1: two on GPU 0 need 4 GiB of its 3.
    assert gpu_memory_refusal((0, 1), 3, 2 * GIB, free) == (
        "2 workers need at least 4.0 GiB on GPU 0 for their weights; it has 3.0 GiB free"
    )
    assert gpu_memory_refusal((0, 1), 2, 2 * GIB, free) is None
    assert gpu_memory_refusal((1,), 1, 9 * GIB, free) == (
        "1 worker needs at least 9.0 GiB on GPU 1 for their weights; it has 8.0 GiB free"
    )
    # Nothing known about a GPU (no NVML): nothing refused.
    assert gpu_memory_refusal((2,), 4, 100 * GIB, free) is None
    assert gpu_memory_refusal((), 4, 100 * GIB, free) is None
