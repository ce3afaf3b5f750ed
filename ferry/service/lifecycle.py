"""Model versions coming and going: start-up models, registration, scaling, removal, and
the snapshot written after each change. Sizing is planned by ``ferry.capacity``;
the GPU the next model starts on is kept here."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Coroutine, Mapping
from pathlib import Path
from typing import Any

from ferry.capacity import sizing
from ferry.capacity.budgets import estimated_footprint, memory_budgets
from ferry.capacity.placement import gpu_memory_refusal, least_committed_gpu, model_gpus
from ferry.config.settings import ServerSettings, available_cores
from ferry.errors import (
    ConfigError,
    FerryError,
    InvalidRequest,
    ModelLoadFailed,
)
from ferry.metrics.definitions import FerryMetrics
from ferry.metrics.gpu import read_gpus
from ferry.scheduling.observers import Observer
from ferry.scheduling.pool import ran_out_of_memory
from ferry.scheduling.registry import ModelRegistry, ModelVersion
from ferry.scheduling.residency import Residency, ResidencyEvents
from ferry.scheduling.runner_settings import runner_settings
from ferry.service.archives import Archives, as_registered
from ferry.service.snapshots import snapshot_folder, snapshot_of, write_snapshot
from ferry.service.startup import (
    is_default,
    startup_store,
)
from ferry.service.types import ModelRef, RegisterRequest, Registration
from ferry.store.archive import ModelArchive
from ferry.store.remote import removed_if_fails, removed_on_failure
from ferry.store.workdir import open_work_dir
from ferry.worker_handles.handle import WorkerFactory

log = logging.getLogger("ferry.service")


class ModelLifecycle:
    """The registered model versions and their workers, from start-up to ``close``."""

    def __init__(
        self,
        settings: ServerSettings,
        start_worker: WorkerFactory,
        metrics: FerryMetrics,
        machine: sizing.Machine,
        observer: Observer | None = None,
    ) -> None:
        """``observer``: what watches every version's requests (tracing), if anything."""
        self.settings = settings
        self.observer = observer
        self.registry = ModelRegistry()
        self.metrics = metrics
        self.machine = machine
        self.opening_startup_models = False
        """Start-up archives are being opened, not yet registered: not Healthy yet."""
        self.startup_done = False
        """The start-up models are registered and each has tried its first start."""
        self._start_worker = start_worker
        self._next_gpu = 0
        self._background: set[asyncio.Task[None]] = set()
        self.residency = Residency(memory_budgets(settings, machine.gpus), events=_Budget(metrics))
        self._work_dir = open_work_dir()  # also removes those of servers that were killed
        self.archives = Archives(settings, self.work_dir)

    @property
    def work_dir(self) -> Path:
        """Where this server unpacks archives."""
        return Path(self._work_dir.name)

    # --- starting a version --------------------------------------------------------------

    def start(
        self,
        archive: ModelArchive,
        *,
        at_startup: bool,
        startup_timeout: float | None = None,
        sharing_workers: int | None = None,
        share: bool = False,
    ) -> ModelVersion:
        """Register the version and start its workers (without waiting for them);
        ``share``: in the shared process group unless it names one (or sharing is off).

        Raises ``ConfigError`` if they would take the server past ``max_workers_total``; a
        version refused here leaves nothing unpacked.
        """
        try:
            entry = self._new_version(archive, at_startup, startup_timeout, sharing_workers, share)
            self.registry.add(entry)
        except FerryError:
            archive.free()
            raise
        runner = entry.runner
        self.residency.add(
            runner,
            on_demand=runner.settings.load_on_demand,
            estimate=estimated_footprint(archive, runner.settings.gpu_ids),
        )
        runner.demand = self.residency.wanted
        runner.load_refused = self.residency.refusal
        runner.start()
        return entry

    def _new_version(
        self,
        archive: ModelArchive,
        at_startup: bool,
        startup_timeout: float | None,
        sharing_workers: int | None,
        share: bool,
    ) -> ModelVersion:
        config, machine = archive.config, self.machine
        first = self._next_gpu
        if machine.gpus:  # where the models measured so far hold the least memory
            first = least_committed_gpu(machine.gpus, self.residency.committed(), first)
        gpu_ids = model_gpus(machine.gpus, config.device_type, config.device_ids, first)
        workers = sizing.worker_count(config, self.settings, machine)
        label = f"{archive.name} v{archive.version}"
        on_demand = config.load_on_demand
        if on_demand is None:
            on_demand = self.settings.load_models_on_demand
        policy = self.settings.share_worker_processes
        if (share or on_demand) and policy == "auto":
            # Loaded on demand, a model joins a running process rather than starting one.
            policy = "always"
        group = sizing.process_group_for(
            config, policy, self._process_uses(), label, workers, self._worker_limit(), gpu_ids
        )
        settings = runner_settings(
            config,
            self.settings,
            machine,
            gpu_ids=gpu_ids,
            requested_startup_timeout=startup_timeout,
            sharing_workers=sharing_workers,
            process_group=group,
            load_on_demand=on_demand,
        )
        refusal = self._over_worker_limit(
            sizing.ProcessUse(label, settings.workers, group, gpu_ids)
        ) or _gpu_memory_refusal(archive, gpu_ids, settings.workers)
        if refusal is not None:
            raise ConfigError(refusal)
        if gpu_ids and not config.device_ids:
            self._next_gpu = gpu_ids[0] + settings.workers
        metrics = self.metrics.for_model(archive.name, archive.version)
        return ModelVersion.serving(
            archive,
            settings,
            self.settings,
            self._start_worker,
            metrics,
            at_startup=at_startup,
            observer=self.observer,
        )

    def _process_uses(self, replacing: ModelVersion | None = None) -> list[sizing.ProcessUse]:
        """The worker processes of every registered version (but ``replacing``)."""
        return [
            sizing.ProcessUse(
                f"{entry.archive.name} v{entry.archive.version}",
                # A model loaded on demand counts at its workers once loaded.
                entry.runner.settings.workers
                if entry.runner.settings.load_on_demand
                else len(entry.runner.slots),
                entry.runner.settings.process_group,
                entry.runner.settings.gpu_ids,
            )
            for entry in self.registry.all_versions()
            if entry is not replacing
        ]

    def _worker_limit(self) -> int:
        return sizing.worker_limit(self.settings, available_cores())

    def _over_worker_limit(
        self, use: sizing.ProcessUse, replacing: ModelVersion | None = None
    ) -> str | None:
        """Why ``use`` (instead of ``replacing``'s processes) would be too many."""
        uses = [use, *self._process_uses(replacing)]
        return sizing.over_worker_limit(uses, self._worker_limit())

    async def _unless_loaded(self, entry: ModelVersion) -> None:
        """Once every worker has tried to start: if none could, unregister the version
        again, so a model that cannot load is never left half-registered."""
        runner, archive = entry.runner, entry.archive
        await runner.wait_started()
        if not runner.slots or runner.ready_workers > 0:
            return
        reasons = "; ".join(sorted({slot.last_error for slot in runner.slots}))
        out_of_memory = ran_out_of_memory(runner.slots)
        with contextlib.suppress(FerryError):
            if self.registry.get(archive.name, archive.version) is entry:
                self.registry.remove(archive.name, archive.version)
        await runner.stop()
        await asyncio.to_thread(archive.free)  # its workers are gone
        self.metrics.forget_model(archive.name, archive.version)
        raise ModelLoadFailed(
            f"Model {archive.name} v{archive.version} failed to load: {reasons}",
            out_of_memory=out_of_memory,
        )

    # --- start-up ------------------------------------------------------------------------

    async def load_startup_models(self) -> None:
        """Open, start and wait for the start-up models; then the ``startup`` snapshot."""
        store = startup_store(self.settings)
        if store is None:
            self.startup_done = True
            return
        self.opening_startup_models = True
        try:
            archives = await self.archives.startup_models(store)
            counts = [sizing.worker_count(a.config, self.settings, self.machine) for a in archives]
            sharing = sum(counts)
            # Past the cap in processes of their own, they share from the first on: packing
            # only those that come last would leave most processes to the first few.
            needed = sizing.process_count(
                sizing.ProcessUse(a.name, count, a.config.process_group or "")
                for a, count in zip(archives, counts, strict=True)
            )
            share = needed > self._worker_limit()
            if share and self.settings.share_worker_processes == "auto":
                log.info(
                    "%d start-up models would take %d worker processes, past "
                    "max_workers_total (%d): they share processes (process group %r; "
                    "share_worker_processes=never refuses instead)",
                    len(archives),
                    needed,
                    self._worker_limit(),
                    sizing.SHARED_GROUP,
                )
            started = [
                self.start(archive, at_startup=True, sharing_workers=sharing, share=share)
                for archive in archives
            ]
        finally:
            self.opening_startup_models = False
        for archive in archives:
            if is_default(self.settings, archive):
                self.registry.set_default(archive.name, archive.version)
        await asyncio.gather(*(entry.runner.wait_started() for entry in started))
        for entry in started:
            _log_started(entry)
        self.startup_done = True
        self.snapshot_changed("startup")

    # --- registration and removal --------------------------------------------------------

    async def register(self, request: RegisterRequest) -> Registration:
        """Register a model version; says whether its workers are up already.

        A registration whose workers all fail to load is rolled back (a synchronous one
        raises ``ModelLoadFailed`` with the reason). An archive downloaded for a
        registration that fails is deleted again, so that retrying it works.
        """
        self.archives.store()  # no store: refused before anything else
        if request.runtime is not None and request.runtime.lower() != "python":
            raise InvalidRequest(f"runtime {request.runtime!r} is not supported; use python")
        archive = await self.archives.open(request.url, request.model_name)
        with removed_on_failure(archive.downloaded):  # bad packages, exists, cannot load
            archive = await self.archives.with_packages(as_registered(archive, request))
            entry = self.start(archive, at_startup=False, startup_timeout=request.startup_timeout)
            ref = ModelRef(archive.name, archive.version)
            workers = len(entry.runner.slots)
            if not request.synchronous and workers:
                loading = removed_if_fails(archive.downloaded, self._unless_loaded(entry))
                self._in_background(loading)
                self.snapshot_changed()
                return Registration(ref, workers, ready=False)
            await self._unless_loaded(entry)
        self.snapshot_changed()
        return Registration(ref, workers, ready=True)

    def _in_background(self, work: Coroutine[Any, Any, None]) -> None:
        task = asyncio.create_task(work)
        self._background.add(task)
        task.add_done_callback(self._background_done)

    def _background_done(self, task: asyncio.Task[None]) -> None:
        self._background.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("%s", task.exception())

    async def load_archive(self, archive: ModelArchive, startup_timeout: float | None) -> None:
        """Register ``archive`` and wait for its workers; raises ``ModelLoadFailed`` (and
        leaves nothing registered) when none can start."""
        archive = await self.archives.with_packages(archive)
        entry = self.start(archive, at_startup=False, startup_timeout=startup_timeout)
        await self._unless_loaded(entry)

    async def remove(self, name: str, version: str | None = None) -> ModelRef:
        """Unregister a version and stop its workers (no snapshot: ``unregister``'s)."""
        entry = self.registry.remove(name, version)
        self.residency.remove(entry.runner.label)
        await entry.runner.stop()
        await asyncio.to_thread(entry.archive.free)  # its workers are gone
        if entry.archive.downloaded is not None:
            entry.archive.downloaded.unlink(missing_ok=True)
        self.metrics.forget_model(entry.archive.name, entry.archive.version)
        return ModelRef(entry.archive.name, entry.archive.version)

    async def unregister(self, name: str, version: str | None) -> ModelRef:
        ref = await self.remove(name, version)
        self.snapshot_changed()
        return ref

    # --- changing a version --------------------------------------------------------------

    async def scale(
        self, name: str, version: str | None, min_worker: int, max_worker: int, synchronous: bool
    ) -> Registration:
        """Run ``min_worker`` workers. Synchronously, raises ``ModelLoadFailed`` with the
        reason when new workers fail to come up (and leaves the model as it was)."""
        if min_worker < 0 or max_worker < min_worker:
            raise InvalidRequest("min_worker must be >= 0 and max_worker >= min_worker")
        entry = self.registry.get(name, version)
        runner = entry.runner
        threads_before = runner.settings.torch_threads
        added = min_worker - len(runner.slots)
        if added > 0:
            use = sizing.ProcessUse(
                f"{entry.archive.name} v{entry.archive.version}",
                min_worker,
                runner.settings.process_group,
                runner.settings.gpu_ids,
            )
            refusal = self._over_worker_limit(use, replacing=entry)
            if refusal is not None:
                raise InvalidRequest(refusal)
            # The model's share for its new worker count (registered with none, TorchServe's
            # default, it was a lone worker's: every core, which each new one then took);
            # pinned, the new workers split the cores still free.
            runner.set_torch_threads(sizing.torch_threads(self.machine, min_worker, added))
        try:
            await runner.scale(min_worker, max_worker, wait=synchronous)
        except ModelLoadFailed:
            runner.set_torch_threads(threads_before)  # the scale-up was undone
            raise
        self.snapshot_changed()
        ref = ModelRef(entry.archive.name, entry.archive.version)
        return Registration(ref, len(entry.runner.slots), ready=synchronous)

    def set_batch_policy(
        self, name: str, version: str | None, policy: str, options: Mapping[str, Any]
    ) -> ModelRef:
        """Switch the model version's batch policy, with its options by model-config.yaml
        key; queued requests stay and are batched by the new one (``InvalidRequest`` for an
        unknown policy, or one a stateful model cannot use)."""
        entry = self.registry.get(name, version)
        try:
            entry.runner.set_batch_policy(policy, options)
        except ValueError as exc:
            raise InvalidRequest(str(exc)) from None
        self.snapshot_changed()
        return ModelRef(entry.archive.name, entry.archive.version)

    def set_default(self, name: str, version: str) -> None:
        self.registry.set_default(name, version)
        self.snapshot_changed()

    def snapshot_changed(self, kind: str = "snapshot") -> None:
        """Write a snapshot unless snapshots are off. A few hundred bytes, written in the
        loop; a failure is logged and never fails the change itself."""
        folder = snapshot_folder(self.settings)
        if folder is None:
            return
        try:
            write_snapshot(folder, snapshot_of(self.registry, self.settings.model_store), kind)
        except OSError as error:
            log.warning("cannot write a model snapshot in %s: %s", folder, error)

    async def close(self) -> None:
        for task in self._background:
            task.cancel()
        entries = self.registry.all_versions()
        await asyncio.gather(*(entry.runner.stop() for entry in entries))
        for entry in entries:
            entry.archive.free()
        self._work_dir.cleanup()


def _log_started(entry: ModelVersion) -> None:
    runner = entry.runner
    log.info(
        "model %s v%s: %d/%d workers ready, batch_size %d, max_batch_delay %.0f ms, "
        "%d torch threads per worker",
        runner.name,
        runner.version,
        runner.ready_workers,
        len(runner.slots),
        runner.settings.batch_size,
        runner.settings.max_batch_delay * 1000,
        runner.settings.torch_threads,
    )


class _Budget(ResidencyEvents):
    def __init__(self, metrics: FerryMetrics) -> None:
        self.metrics = metrics

    def over_budget(self, label: str) -> None:
        if self.metrics.enabled:
            self.metrics.budget_exceeded.counter().inc()


def _gpu_memory_refusal(
    archive: ModelArchive, gpu_ids: tuple[int, ...], workers: int
) -> str | None:
    """``gpu_memory_refusal`` with the GPUs' free memory as NVML reports it now (nothing is
    checked without NVML) and the archive's serialized file as each worker's weights."""
    serialized = archive.manifest.serialized_file
    if not gpu_ids or not serialized:
        return None
    weights = archive.model_dir / serialized
    if not weights.is_file():
        return None
    free = {r.index: r.memory_total_bytes - r.memory_used_bytes for r in read_gpus()}
    # (read_gpus answers what it could read; a GPU it could not is not checked)
    refusal = gpu_memory_refusal(gpu_ids, workers, weights.stat().st_size, free)
    return None if refusal is None else f"model {archive.name}: {refusal}"
