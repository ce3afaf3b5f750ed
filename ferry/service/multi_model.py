"""SageMaker's multi-model endpoints over registration and residency: SageMaker tells the
container which models to hold (``POST /models``, ``DELETE /models/NAME``), and evicts one
and retries when a load answers 507. Transports call these (``ferry.http.sagemaker_models``).

A load registers the model (``ferry.service.lifecycle``; on demand when
``load_models_on_demand`` is on, as ``ferry sagemaker-serve`` sets it) and brings its
workers up before answering. It is refused with ``InsufficientMemory`` (507), leaving
nothing registered, when the model cannot fit the memory budget (``model_memory_budget_mb``)
beside the models that must stay: before its load, judged by its weight files, and after,
by what its workers measured; so is a load that failed while the container's OOM killer
killed a process (a worker, most likely: SageMaker should evict a model, not give up).
Idle models Ferry loaded on demand do not count as staying:
Ferry evicts them, least recently used first, to make room (``ferry.scheduling.residency``),
and loads one again when a request for it comes. SageMaker still counts them as loaded.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable

from ferry import procinfo
from ferry.errors import FerryError, InsufficientMemory, ModelAlreadyExists, ModelLoadFailed
from ferry.service.front import FerryService
from ferry.service.types import RegisterRequest, Registration


async def load(
    service: FerryService,
    name: str,
    url: str,
    oom_kills: Callable[[], int | None] = procinfo.oom_kills,
) -> Registration:
    """Register ``name`` from ``url`` (a folder or archive in the model store) and load it;
    ``ModelAlreadyExists`` if a model of that name is registered, ``InsufficientMemory``
    if it does not fit or the OOM killer struck while it loaded (``oom_kills``: the
    container's count so far), ``ModelLoadFailed`` if its workers fail."""
    if name in service.model_names():
        raise ModelAlreadyExists(f"Model {name} is already loaded")
    workers = service.settings.default_workers_per_model or 1  # as the toolkit's 1
    request = RegisterRequest(url=url, model_name=name, initial_workers=workers, synchronous=True)
    kills_before = oom_kills()
    registered = await service.register(request)
    ref = registered.model
    try:
        await _load_within_budget(service, ref.name, ref.version)
    except Exception as error:
        await _forget(service, ref.name, ref.version)
        if not isinstance(error, InsufficientMemory) and _killed_since(kills_before, oom_kills):
            raise InsufficientMemory(
                f"Model {name} failed to load ({error}) and the OOM killer killed a process "
                "of this container meanwhile: unload a model and load it again"
            ) from error
        if isinstance(error, ModelLoadFailed) and error.out_of_memory:
            raise InsufficientMemory(
                f"Model {name} ran out of memory while loading ({error}): unload a model and "
                "load it again"
            ) from error
        if isinstance(error, FerryError):
            raise
        raise ModelLoadFailed(f"Model {name} failed to load: {error}") from error
    ready = service.readiness(ref.name, ref.version).ready
    workers_up = service.registry.get(ref.name, ref.version).runner.ready_workers
    return Registration(ref, workers_up, ready)


async def _load_within_budget(service: FerryService, name: str, version: str) -> None:
    """Load the registered model: ``InsufficientMemory`` when it cannot fit, judged by its
    weight files before, by what its workers measured after."""
    residency = service.models.residency
    label = service.registry.get(name, version).runner.label
    if not residency.has_room_for(label):
        raise InsufficientMemory(_no_room(service, name, "its weights"))
    await service.load_model(name, version)
    if residency.over_budget():
        raise InsufficientMemory(_no_room(service, name, "what it took once loaded"))


def _killed_since(before: int | None, oom_kills: Callable[[], int | None]) -> bool:
    after = oom_kills()
    return before is not None and after is not None and after > before


def _no_room(service: FerryService, name: str, judged_by: str) -> str:
    budget = service.settings.model_memory_budget_mb
    return (
        f"Model {name} does not fit the model memory budget ({budget} MiB) beside the "
        f"models that stay loaded (judged by {judged_by}): unload one and load it again"
    )


async def _forget(service: FerryService, name: str, version: str) -> None:
    """Unregister a model whose load was refused or failed, so that a retry can load it."""
    with contextlib.suppress(FerryError):  # already gone: unloaded meanwhile
        await service.unregister(name, version)
