"""How a model version runs: its workers, each one's torch threads, its batch and time
settings. Planned from its model-config.yaml, the server's settings and what the machine
offers, with no state of its own: what changes is passed in (the GPU the next model starts
on, kept by ``ferry.service.lifecycle``; the cores pinned workers hold, by the allocator
``ferry.apis`` made).
"""

from __future__ import annotations

from collections.abc import Iterable
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


def worker_limit(settings: ServerSettings, host_cores: int) -> int:
    """``max_workers_total``, or twice the host's cores (at least 8)."""
    return settings.max_workers_total or default_max_workers_total(host_cores)


SHARED_GROUP = "shared"
"""The process group of models that share processes without naming a group of their own."""


@dataclass(frozen=True)
class ProcessUse:
    """One model version's worker processes, for the cap: ``workers`` of its own, or a
    place in each of ``workers`` processes of ``group``."""

    label: str
    workers: int
    group: str = ""
    gpus: tuple[int, ...] = ()
    """The GPUs its workers take in turn; none on a CPU."""

    def per_device(self) -> dict[int | None, int]:
        """Its workers on each GPU (None: the CPU)."""
        if not self.gpus:
            return {None: self.workers}
        counts: dict[int | None, int] = {}
        for index in range(self.workers):
            gpu = self.gpus[index % len(self.gpus)]
            counts[gpu] = counts.get(gpu, 0) + 1
        return counts


def process_count(uses: Iterable[ProcessUse]) -> int:
    """Processes they take: each worker of its own, and per group and device as many as
    the group's model with the most workers there (a process holds one worker of each
    model, and serves one GPU).

    >>> process_count([ProcessUse("a", 2), ProcessUse("b", 1, "g"), ProcessUse("c", 3, "g")])
    5
    >>> process_count([ProcessUse("b", 1, "g", (0,)), ProcessUse("c", 1, "g", (1,))])
    2
    """
    own = 0
    groups: dict[tuple[str, int | None], int] = {}
    for use in uses:
        if not use.group:
            own += use.workers
            continue
        for device, count in use.per_device().items():
            key = (use.group, device)
            groups[key] = max(groups.get(key, 0), count)
    return own + sum(groups.values())


def process_group_for(
    config: ModelConfig,
    policy: str,
    others: Iterable[ProcessUse],
    label: str,
    workers: int,
    limit: int,
    gpus: tuple[int, ...] = (),
) -> str:
    """The process group of a model version about to start beside ``others``: its own
    ``processGroup``; else by ``share_worker_processes`` (``policy``): ``always``, the
    shared group; ``never``, none; ``auto``, none while processes of its own keep the
    server within ``limit``, else the shared group.

    >>> process_group_for(ModelConfig(), "auto", [ProcessUse("a", 8)], "b", 1, 8)
    'shared'
    """
    if config.process_group:
        return config.process_group
    if policy == "always":
        return SHARED_GROUP
    if policy == "never":
        return ""
    fits = process_count([*others, ProcessUse(label, workers, "", gpus)]) <= limit
    return "" if fits else SHARED_GROUP


def over_worker_limit(uses: Iterable[ProcessUse], limit: int) -> str | None:
    """Why running ``uses`` would take more than ``limit`` processes in all, or None;
    the reason names the ways out.

    >>> over_worker_limit([ProcessUse("a v1", 3), ProcessUse("b v1", 6, "g")], 5)[:77]
    '9 worker processes in all (a v1: 3, process group g: 6 (b v1: 6)) exceed the '
    """
    uses = list(uses)
    total = process_count(uses)
    if total <= limit:
        return None
    members: dict[str, list[ProcessUse]] = {}
    parts = []
    for use in uses:
        if use.group:
            members.setdefault(use.group, []).append(use)
        elif use.workers:
            parts.append(f"{use.label}: {use.workers}")
    for name, group in members.items():
        inside = ", ".join(f"{use.label}: {use.workers}" for use in group if use.workers)
        parts.append(f"process group {name}: {process_count(group)} ({inside})")
    return (
        f"{total} worker processes in all ({', '.join(parts)}) exceed the limit of {limit} "
        f"(max_workers_total){WORKER_LIMIT_FIX}"
    )


WORKER_LIMIT_FIX = (
    "; raise it (--max-workers-total, or max_workers_total in config.properties), give "
    "the models fewer workers (minWorkers in their model-config.yaml), or let them share "
    "processes (share_worker_processes=always in config.properties, or a processGroup in "
    "their model-config.yaml)"
)
