"""Server settings: the single source of truth for how Ferry runs.

``ServerSettings`` gathers the settings of each group (its bases, one dataclass a group,
in ``network``, ``models`` and ``operations``). Each field is one setting, declared once
with ``setting()`` (``declare``): its type and default, and its value kind, meaning and
names, from which ``ferry.config.options`` lists the options, ``ferry serve --help`` its
flags and docs/configuration.md its tables. ``ferry.config.sources`` fills the model from
flags, environment variables and ``config.properties``; nothing reads the environment at
import time.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from ferry.config.settings.models import (
    ManyModelSettings,
    ModelStoreSettings,
    RaySettings,
    WorkerSettings,
)
from ferry.config.settings.network import AddressSettings, GrpcSettings, SecuritySettings
from ferry.config.settings.operations import (
    LifecycleSettings,
    LimitSettings,
    ObservabilitySettings,
)
from ferry.config.value_types import TORCHSERVE_MODEL_METRICS, Address, ModelMetric

__all__ = [
    "TORCHSERVE_MODEL_METRICS",
    "Address",
    "ModelMetric",
    "ServerSettings",
    "available_cores",
    "default_max_workers_total",
    "default_workers_per_model",
    "threads_per_worker",
    "usable_cpus",
]


@dataclass(frozen=True)
class ServerSettings(
    AddressSettings,
    GrpcSettings,
    SecuritySettings,
    ModelStoreSettings,
    WorkerSettings,
    ManyModelSettings,
    LimitSettings,
    ObservabilitySettings,
    LifecycleSettings,
    RaySettings,
):
    """Everything the server needs to start: every setting of every group."""


def usable_cpus() -> frozenset[int]:
    """The CPUs this process may run on (its affinity, e.g. in containers), else every CPU."""
    try:
        return frozenset(os.sched_getaffinity(0)) or frozenset({0})
    except AttributeError:  # not Linux
        return frozenset(range(max(1, os.cpu_count() or 1)))


def available_cores() -> int:
    """Cores this process may run on (respects CPU affinity, e.g. in containers)."""
    return len(usable_cpus())


def default_workers_per_model(cores: int, gpus: int) -> int:
    """One worker per GPU; on CPU one worker, since torch already uses every core."""
    return gpus if gpus > 0 else 1


def default_max_workers_total(cores: int) -> int:
    """Twice the cores, at least 8: room for a few models, not for thousands of workers."""
    return max(8, 2 * cores)


def threads_per_worker(cores: int, workers: int) -> int:
    """Split the cores between a model's workers so they do not oversubscribe the CPU."""
    return max(1, cores // max(1, workers))
