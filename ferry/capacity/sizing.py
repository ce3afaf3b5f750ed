"""How many workers a model version runs, each one's torch threads, and the worker
processes the server's models take together (process groups, ``max_workers_total``).
Planned from its model-config.yaml, the server's settings and what the machine offers,
with no state of its own: what changes is passed in (the GPU the next model starts on,
kept by ``ferry.service.lifecycle``; the cores pinned workers hold, by the allocator
``ferry.apis`` made). ``ferry.scheduling.runner_settings`` turns the plan into a
version's ``RunnerSettings``.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Protocol

from ferry.capacity.placement import model_gpu_count
from ferry.config.model_config import ModelConfig
from ferry.config.settings import (
    ServerSettings,
    available_cores,
    default_max_workers_total,
    default_workers_per_model,
    threads_per_worker,
)


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
