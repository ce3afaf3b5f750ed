"""A model version's ``RunnerSettings``: its model-config.yaml first, the server's
defaults after, with its workers and torch threads as ``ferry.capacity.sizing`` plans
them."""

from __future__ import annotations

from ferry.capacity.sizing import Machine, torch_threads, worker_count
from ferry.config.model_config import ModelConfig
from ferry.config.settings import ServerSettings
from ferry.scheduling.model_runner import RunnerSettings
from ferry.scheduling.pool import RecyclePolicy
from ferry.scheduling.sequences import SequenceSettings


def runner_settings(
    config: ModelConfig,
    settings: ServerSettings,
    machine: Machine,
    *,
    gpu_ids: tuple[int, ...],
    requested_startup_timeout: float | None = None,
    sharing_workers: int | None = None,
    process_group: str = "",
    load_on_demand: bool = False,
) -> RunnerSettings:
    """The model version's settings: model-config.yaml first, the server's defaults
    after. ``sharing_workers``: pinned, how many workers (this model's among them) will
    claim the free cores; None: this model's alone. ``process_group``: the one chosen
    for it (``process_group_for``)."""
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
        batch_policy_options=config.batch_policy_options,
        client_timeout_ms=config.client_timeout_ms,
        deadline_action=config.deadline_action or "reject",
        stream_timeout=settings.stream_timeout or None,
        cancel_grace=settings.cancel_grace,
        torch_threads=torch_threads(machine, max(1, workers), sharing_workers),
        gpu_ids=gpu_ids,
        max_workers=config.max_workers or workers,
        sequences=sequence_settings(config, workers),
        process_group=process_group,
        load_on_demand=load_on_demand,
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
