"""Memory budgets for models loaded on demand: what each device may hold, what a model is
expected to take, whether it fits, and which idle models to evict, least recently used
first, to make room. Pure planning; ``ferry.scheduling.residency`` applies it to the
models as they load and go idle.

A model's footprint is what its workers measured when they loaded
(``WorkerInfo.footprint_bytes``, ``gpu_bytes``); before its first load, the size of its
weights file stands in.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from ferry.config.settings import ServerSettings
from ferry.store.archive import ModelArchive
from ferry.store.sagemaker_layout import WEIGHT_SUFFIXES

HOST = "host"
"""The budget and footprint key of host memory; GPUs are ``cuda:N``."""

Footprint = Mapping[str, int]
"""Bytes per device (``HOST``, ``cuda:0`` ...)."""


def memory_budgets(settings: ServerSettings, gpus: int) -> dict[str, int]:
    """The residency budgets in bytes: host memory, and each GPU's (none unset)."""
    budgets: dict[str, int] = {}
    if settings.model_memory_budget_mb:
        budgets[HOST] = settings.model_memory_budget_mb << 20
    if settings.gpu_memory_budget_mb:
        for gpu in range(gpus):
            budgets[f"cuda:{gpu}"] = settings.gpu_memory_budget_mb << 20
    return budgets


def estimated_footprint(archive: ModelArchive, gpu_ids: tuple[int, ...]) -> dict[str, int]:
    """Before its first load, a model is expected to take its weights file's size, on the
    host (and on the GPU its first worker runs on). Without a serialized file (SageMaker's
    layout: ``model_fn`` reads what it likes), the weight files at the top of its folder."""
    serialized = archive.manifest.serialized_file
    if serialized:
        weights = [archive.model_dir / serialized]
    else:
        weights = [p for p in archive.model_dir.glob("*") if p.suffix in WEIGHT_SUFFIXES]
    size = sum(path.stat().st_size for path in weights if path.is_file())
    estimate = {HOST: size}
    if gpu_ids:
        estimate[f"cuda:{gpu_ids[0]}"] = size
    return estimate


@dataclass(frozen=True)
class Candidate:
    """A resident model the policy may evict."""

    label: str
    footprint: Footprint
    last_used: float


def fits(used: Footprint, needed: Footprint, budgets: Footprint) -> bool:
    """``needed`` beside ``used`` stays within every budget (a device without one: no
    limit)."""
    return all(
        used.get(device, 0) + needed.get(device, 0) <= limit for device, limit in budgets.items()
    )


def choose_evictions(
    needed: Footprint, used: Footprint, candidates: Iterable[Candidate], budgets: Footprint
) -> tuple[list[Candidate], bool]:
    """The candidates to evict, least recently used first, so that ``needed`` fits beside
    what ``used`` keeps; and whether it then fits (False: even evicting every candidate
    that frees a device over its budget is not enough, and those are evicted all the same).
    Only candidates holding memory on a device over its budget are taken.

    >>> a, b = Candidate("a", {"host": 4}, 2.0), Candidate("b", {"host": 4}, 1.0)
    >>> [c.label for c in choose_evictions({"host": 4}, {"host": 8}, [a, b], {"host": 10})[0]]
    ['b']
    """
    remaining = dict(used)
    chosen: list[Candidate] = []
    for candidate in sorted(candidates, key=lambda c: c.last_used):
        if fits(remaining, needed, budgets):
            break
        over = [d for d, limit in budgets.items() if remaining.get(d, 0) + needed.get(d, 0) > limit]
        if not any(candidate.footprint.get(device, 0) for device in over):
            continue
        chosen.append(candidate)
        for device, size in candidate.footprint.items():
            remaining[device] = remaining.get(device, 0) - size
    return chosen, fits(remaining, needed, budgets)


def larger(first: Footprint, second: Footprint) -> dict[str, int]:
    """Per device, the larger of two footprints. A load's measurement only grows what a
    model is taken to need: a load into memory a neighbour just freed barely moves the
    process's resident size, so one measurement can be far below what the model holds
    (its weights file stands in below every measurement)."""
    return {d: max(first.get(d, 0), second.get(d, 0)) for d in {*first, *second}}
