"""What the transports serve, and the one place it is assembled: the transport-neutral
model service and the workflows built over it, with workers as local processes.
``ferry serve`` (``ferry.server``) and each replica of ``ferry serve --ray``
(``ferry.ray_serve.replica``) build theirs with ``Apis.local`` and hand it to every
listener."""

from __future__ import annotations

import asyncio
import functools
import logging
import os
from dataclasses import dataclass

from ferry.capacity.sizing import Machine
from ferry.config.settings import ServerSettings
from ferry.service import FerryService
from ferry.tracing import tracing_for
from ferry.wire.environment import USER_AFFINITY, user_pins_threads
from ferry.worker_handles.core_allocation import CoreAllocator
from ferry.worker_handles.fork_server import ForkServer
from ferry.worker_handles.handle import WorkerFactory
from ferry.worker_handles.process import process_environment, spawn_spare
from ferry.worker_handles.spares import SpareProcesses
from ferry.worker_handles.weight_keepers import WeightKeepers, keeping_weights
from ferry.workflows.manager import WorkflowManager

log = logging.getLogger("ferry.service")


@dataclass(frozen=True)
class Apis:
    service: FerryService
    workflows: WorkflowManager
    spares: SpareProcesses | None = None
    """Spare worker processes of compiled models, stopped with the service."""
    forks: ForkServer | None = None
    """The process CPU workers are forked from, stopped with the service."""
    keepers: WeightKeepers | None = None
    """The weights keepers of models that have one, stopped after their workers."""

    @classmethod
    def over(
        cls,
        service: FerryService,
        spares: SpareProcesses | None = None,
        forks: ForkServer | None = None,
        keepers: WeightKeepers | None = None,
    ) -> Apis:
        return cls(service, WorkflowManager(service), spares, forks, keepers)

    @classmethod
    def local(
        cls, settings: ServerSettings, cores: int | None = None, in_process: bool = False
    ) -> Apis:
        """The service with its workers as processes on this machine. ``cores``: those its
        workers share (default: every one this process may use; a Ray replica passes the
        CPUs Ray gave it); ``in_process``: workers on threads of this process instead
        (``ferry.worker_handles.in_process``: a Ray replica's, on request)."""
        pinned = pinned_cores(settings.cpu_pinning, cores)
        machine = Machine(cores, usable_gpus(settings.number_of_gpu), pinned)
        spares = None
        if settings.spare_worker_for_compiled_models and not in_process:
            spares = SpareProcesses(spawn_spare)
        forks = None
        if settings.fork_workers and not in_process:
            forks = ForkServer(process_environment(None))
        keepers = None if in_process else WeightKeepers()
        workers = (
            in_process_workers() if in_process else local_workers(pinned, spares, forks, keepers)
        )
        tracing = tracing_for(settings.enable_tracing)
        service = FerryService(settings, workers, machine, tracing)
        return cls.over(service, spares, forks, keepers)

    async def close(self) -> None:
        """Workflows first (they free their files), then the service stops every worker,
        then the spare processes."""
        await self.workflows.close()
        await self.service.close()
        if self.spares is not None:
            await self.spares.close()
        if self.forks is not None:
            await self.forks.close()
        if self.keepers is not None:
            await self.keepers.close()
        # The last spans exported: it may wait for the exporter, off the event loop.
        await asyncio.to_thread(self.service.tracing.shutdown)


def usable_gpus(limit: int | None) -> int:
    """The GPUs torch sees, at most ``number_of_gpu`` of them."""
    import torch

    # device_count asks NVML first: the frontend never initialises CUDA (workers own it).
    visible = torch.cuda.device_count()
    return visible if limit is None else min(visible, limit)


def pinned_cores(pin: bool, shared_cores: int | None) -> CoreAllocator | None:
    """The cores workers claim with ``cpu_pinning``; None when Ferry pins nothing."""
    if not pin:
        return None
    if shared_cores is not None:
        log.warning("cpu_pinning ignored: this server shares its machine's cores (Ray)")
        return None
    if user_pins_threads(os.environ):  # theirs stands; each worker keeps its usual share
        names = ", ".join(USER_AFFINITY)
        log.warning("cpu_pinning ignored: threads are bound as one of %s says", names)
        return None
    return CoreAllocator(os.sched_getaffinity(0))


def local_workers(
    pinned: CoreAllocator | None,
    spares: SpareProcesses | None = None,
    forks: ForkServer | None = None,
    keepers: WeightKeepers | None = None,
) -> WorkerFactory:
    """Workers as local processes, those of a process group in processes its models share
    (``ferry.worker_handles.hosts``); with ``pinned``, each worker of its own process has
    its torch threads on cores of its own (``ferry.worker_handles.core_allocation``); with
    ``spares``, compiled models' workers start in spare processes
    (``ferry.worker_handles.spares``); with ``forks``, unpinned CPU workers are forked
    (``ferry.worker_handles.fork_server``); with ``keepers``, the workers of a model with a
    weights keeper start on theirs (``ferry.worker_handles.weight_keepers``)."""
    from ferry.worker_handles.hosts import ProcessHosts, sharing_processes
    from ferry.worker_handles.process import WorkerProcess

    own: WorkerFactory = functools.partial(
        WorkerProcess.start, cores=pinned, spares=spares, forks=forks
    )
    if keepers is not None:
        own = keeping_weights(own, keepers)
    return sharing_processes(own, ProcessHosts())


def in_process_workers() -> WorkerFactory:
    """Workers on threads of this process, each speaking the worker protocol over a
    socket pair (``ferry.worker_handles.in_process``, ``ferry.worker.in_thread``)."""
    from ferry.worker.in_thread import run_worker
    from ferry.worker_handles.in_process import InProcessWorker

    return functools.partial(InProcessWorker.start, run=run_worker)
