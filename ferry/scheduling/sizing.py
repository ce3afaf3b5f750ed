"""How a model version runs: its workers, each one's torch threads, its batch and time
settings. Planned from its model-config.yaml, the server's settings and what the machine
offers, with no state of its own: what changes is passed in (the GPU the next model starts
on, kept by ``ferry.service.lifecycle``; the cores pinned workers hold, by the allocator
``ferry.apis`` made).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol

from ferry.config.model_config import ModelConfig
from ferry.config.settings import (
    ServerSettings,
    available_cores,
    default_max_workers_total,
    default_workers_per_model,
    threads_per_worker,
)
from ferry.scheduling.model_runner import RunnerSettings
from ferry.scheduling.placement import model_gpu_count
from ferry.scheduling.pool import RecyclePolicy
from ferry.scheduling.sequences import SequenceSettings


class PinnedCores(Protocol):
    """With ``cpu_pinning``: the cores workers claim (``ferry.worker_handles``'s allocator)."""

    def free_count(self) -> int:
        """Cores no live worker holds."""


@dataclass(frozen=True)
class Machine:
    """What a plan may use."""

    cores: int | None
    """The cores this server's workers share: a Ray replica's, those Ray gave it; None,
    every one this process may use, counted at each plan (its affinity may change)."""
    gpus: int
    """GPUs Ferry may use (visible ones, capped by ``number_of_gpu``)."""
    pinned: PinnedCores | None = None
    """With ``cpu_pinning``: the cores still free, which new workers split; None unpinned."""

    @property
    def core_count(self) -> int:
        return self.cores or available_cores()


def worker_count(config: ModelConfig, settings: ServerSettings, machine: Machine) -> int:
    """``minWorkers``, else the server's ``default_workers_per_model``, else one per GPU
    the model runs on (its ``deviceIds``, or every usable one; one on a CPU, since torch
    already uses every core)."""
    if config.min_workers is not None:
        return config.min_workers
    gpus = model_gpu_count(machine.gpus, config.device_type, config.device_ids)
    default = default_workers_per_model(machine.core_count, gpus)
    return settings.default_workers_per_model or default


def torch_threads(machine: Machine, workers: int, sharing_workers: int | None = None) -> int:
    """Each worker's share of the cores: of all of them, split between this model's
    ``workers``; pinned, of those free, split between the workers that will claim them
    (``sharing_workers``: at start-up every start-up model's), so that each gets cores of
    its own."""
    unpinned = threads_per_worker(machine.core_count, workers)
    if machine.pinned is None:
        return unpinned
    sharing = sharing_workers or workers
    return pinned_threads(machine.pinned.free_count(), sharing) or unpinned


def pinned_threads(free_cores: int, workers: int) -> int | None:
    """Torch threads per worker when ``workers`` about to start are to split
    ``free_cores`` between them, a core each at least; None when there are fewer cores
    than workers (they keep the unpinned split, and those that find no cores run unpinned).

    >>> pinned_threads(8, 2), pinned_threads(2, 3)
    (4, None)
    """
    return free_cores // workers if 0 < workers <= free_cores else None


def runner_settings(
    config: ModelConfig,
    settings: ServerSettings,
    machine: Machine,
    *,
    gpu_ids: tuple[int, ...],
    requested_startup_timeout: float | None = None,
    sharing_workers: int | None = None,
) -> RunnerSettings:
    """The model version's settings: model-config.yaml first, the server's defaults
    after. ``sharing_workers``: pinned, how many workers (this model's among them) will
    claim the free cores; None: this model's alone."""
    workers = worker_count(config, settings, machine)
    delay_ms = config.max_batch_delay_ms
    if delay_ms is None:
        delay_ms = settings.default_max_batch_delay_ms
    return RunnerSettings(
        batch_size=config.batch_size or settings.default_batch_size,
        max_batch_delay=delay_ms / 1000,
        workers=workers,
        response_timeout=config.response_timeout or settings.default_response_timeout,
        startup_timeout=startup_timeout(config, requested_startup_timeout),
        queue_capacity=config.job_queue_size or settings.job_queue_size,
        batch_policy=config.batch_policy or "adaptive",
        latency_objective_ms=config.latency_objective_ms,
        client_timeout_ms=config.client_timeout_ms,
        deadline_action=config.deadline_action or "reject",
        stream_timeout=settings.stream_timeout or None,
        cancel_grace=settings.cancel_grace,
        torch_threads=torch_threads(machine, max(1, workers), sharing_workers),
        gpu_ids=gpu_ids,
        max_workers=config.max_workers or workers,
        sequences=sequence_settings(config, workers),
        recycle=RecyclePolicy(
            max_requests=config.max_requests_per_worker,
            max_rss_bytes=None
            if config.max_worker_memory_mb is None
            else config.max_worker_memory_mb << 20,
        ),
    )


def sequence_settings(config: ModelConfig, workers: int) -> SequenceSettings | None:
    """A stateful model's limits (None for any other), with TorchServe's defaults: one
    waiting request per sequence, and room for at least batchSize times maxWorkers
    sequences."""
    if not config.sequence_batching or not config.sequence_max_idle_ms:
        return None
    batch_size = config.batch_size or 1
    floor = batch_size * max(workers, config.max_workers or 0)
    return SequenceSettings(
        max_sequences=max(config.max_num_sequence or 1, floor),
        queue_size=config.max_sequence_job_queue_size or 1,
        max_idle=config.sequence_max_idle_ms / 1000,
        timeout=config.sequence_timeout_ms / 1000 if config.sequence_timeout_ms else None,
    )


DEFAULT_STARTUP_TIMEOUT = 120.0
AUTOTUNE_STARTUP_TIMEOUT = 900.0
"""``compile: max-autotune`` benchmarks kernel choices at load: minutes per batch size."""


def startup_timeout(config: ModelConfig, requested: float | None) -> float:
    """TorchServe's precedence: model-config.yaml's ``startupTimeout``, then the
    registration's ``startup_timeout`` (0 included: no worker can start in time), then at
    least 120 s (900 s under ``compile: max-autotune``) and never less than
    ``responseTimeout``."""
    if config.startup_timeout:
        return config.startup_timeout
    if requested is not None:
        return requested
    autotunes = config.optimization.compile_mode == "max-autotune"
    floor = AUTOTUNE_STARTUP_TIMEOUT if autotunes else DEFAULT_STARTUP_TIMEOUT
    return max(floor, config.response_timeout or 0.0)


def worker_limit(settings: ServerSettings, host_cores: int) -> int:
    """``max_workers_total``, or twice the host's cores (at least 8)."""
    return settings.max_workers_total or default_max_workers_total(host_cores)


def over_worker_limit(workers: Mapping[str, int], limit: int) -> str | None:
    """Why running ``workers`` (per model version) would exceed ``limit`` in all, or None;
    the reason names the two ways out.

    >>> over_worker_limit({"a v1": 3, "b v1": 6}, 8)[:64]
    '9 workers in all (a v1: 3, b v1: 6) exceed the limit of 8 (max_w'
    """
    total = sum(workers.values())
    if total <= limit:
        return None
    counts = ", ".join(f"{name}: {count}" for name, count in workers.items() if count)
    return (
        f"{total} workers in all ({counts}) exceed the limit of {limit} (max_workers_total)"
        f"{WORKER_LIMIT_FIX}"
    )


WORKER_LIMIT_FIX = (
    "; raise it (--max-workers-total, or max_workers_total in config.properties) or give "
    "the models fewer workers (minWorkers in their model-config.yaml)"
)
