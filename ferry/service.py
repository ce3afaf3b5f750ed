"""The transport-neutral service: every HTTP (or later gRPC) adapter calls this.

Data plane (predict, health) and model management (register, scale, describe, ...);
it owns the model registry and knows nothing about HTTP.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import logging
import math
import os
from collections.abc import Callable, Mapping
from pathlib import Path

from ferry.config.image_limits import ImageLimits
from ferry.config.model_config import ModelConfig, apply_overrides
from ferry.config.settings import (
    ServerSettings,
    available_cores,
    default_max_workers_total,
    default_workers_per_model,
)
from ferry.config.settings import threads_per_worker as split_threads
from ferry.errors import (
    ClientGone,
    ConfigError,
    FerryError,
    InvalidInput,
    InvalidRequest,
    ModelApiDisabled,
    ModelLoadFailed,
    NoWorkerAvailable,
    PackageInstallFailed,
    ResponseTooLarge,
)
from ferry.metrics.definitions import FerryMetrics
from ferry.metrics.gpu import read_gpus
from ferry.pending_prediction import PendingPrediction
from ferry.scheduling.jobs import Job, StreamedPart, next_request_id
from ferry.scheduling.model_runner import ModelRunner, RunnerSettings
from ferry.scheduling.placement import model_gpus
from ferry.scheduling.pool import RecyclePolicy
from ferry.scheduling.registry import ModelRegistry, ModelVersion
from ferry.service_types import (
    Health,
    InputPart,
    ModelMetadata,
    ModelPage,
    ModelRef,
    OnPredictionPart,
    Prediction,
    PredictionPart,
    Readiness,
    RegisterRequest,
    Registration,
    TensorSpec,
    page_of,
)
from ferry.snapshots import ServerSnapshot, VersionSnapshot, snapshot_folder, write_snapshot
from ferry.status import ModelStatus, model_status
from ferry.store.archive import ModelArchive, open_model, resolve_model_entries
from ferry.store.packages import install_packages, requirements_path
from ferry.store.pip_sources import PipSources, startup_warning
from ferry.store.remote import (
    fetch_archive,
    is_remote,
    removed_if_fails,
    removed_on_failure,
)
from ferry.store.workdir import open_work_dir
from ferry.worker import messages
from ferry.worker.cpu_pinning import (
    USER_AFFINITY,
    CoreAllocator,
    pinned_threads,
    user_pins_threads,
)
from ferry.worker.handle import WorkerFactory
from ferry.worker.spec import WorkerSpec

log = logging.getLogger("ferry.service")

OnHangUp = Callable[[Callable[[], None]], None]
"""Registers a callback the transport calls if the client goes away before its answer."""

MAX_REQUEST_ID = 128
"""Longest ``x-request-id`` a client may choose; a longer one is replaced by Ferry's."""


def _visible_gpus() -> int:
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


DEADLINE_HEADER = "x-ferry-deadline-ms"
"""A request's time budget in milliseconds from its arrival: past it, or when its batch
cannot finish within it, it is answered ``DeadlineExceeded`` instead of being run."""


def deadline_budget(headers: dict[str, str]) -> float | None:
    """Seconds the request may take, from ``DEADLINE_HEADER``; ``InvalidInput`` if bad."""
    value = next((v for k, v in headers.items() if k.lower() == DEADLINE_HEADER), None)
    if value is None:
        return None
    try:
        milliseconds = float(value)
    except ValueError:
        milliseconds = math.nan
    if not milliseconds > 0 or math.isinf(milliseconds):
        raise InvalidInput(f"{DEADLINE_HEADER} must be a positive number of milliseconds")
    return milliseconds / 1000


PRIORITY_HEADER = "x-ferry-priority"
"""A request's priority, an integer from -100 to 100 (default 0): queued requests of a
higher priority go into the next batch first."""
PRIORITY_RANGE = range(-100, 101)


def request_priority(headers: dict[str, str]) -> int:
    """The priority ``PRIORITY_HEADER`` asks for (0 without it); ``InvalidInput`` if bad."""
    value = next((v for k, v in headers.items() if k.lower() == PRIORITY_HEADER), None)
    if value is None:
        return 0
    try:
        priority = int(value.strip())
    except ValueError:
        priority = PRIORITY_RANGE.stop
    if priority not in PRIORITY_RANGE:
        raise InvalidInput(f"{PRIORITY_HEADER} must be an integer from -100 to 100")
    return priority


class FerryService:
    """Predict, health and model management, independent of any transport."""

    def __init__(
        self,
        settings: ServerSettings,
        start_worker: WorkerFactory | None = None,
        cores: int | None = None,
    ) -> None:
        self.settings = settings
        self._cores = cores
        """The cores this server's workers share (default: all this process may use; a
        Ray replica passes the CPUs Ray gave it)."""
        self._pinned_cores = _pinned_cores(settings.cpu_pinning, cores)
        """With ``cpu_pinning``: the cores workers claim, and so split their threads over."""
        self._start_worker = start_worker or _local_worker_factory(self._pinned_cores)
        self.registry = ModelRegistry()
        self.metrics = FerryMetrics(
            enabled=settings.enable_metrics_api,
            max_handler_series=settings.max_handler_metric_series,
        )
        self._background: set[asyncio.Task[None]] = set()
        self._opening_startup_models = False
        """Start-up archives are being opened, not yet registered: not Healthy yet."""
        self._work_dir = open_work_dir()  # also removes those of servers that were killed
        visible = _visible_gpus()
        limit = settings.number_of_gpu
        self._gpus = visible if limit is None else min(visible, limit)
        self._next_gpu = 0
        self._client_request_ids: set[str] = set()
        """Clients' ``x-request-id`` values in flight: the dispatcher keys jobs by id."""
        self.draining = False
        """Stopping: requests are still served, readiness says no (``drain_delay``)."""
        self._pip_sources = PipSources(settings.pip_index_url, settings.pip_find_links)
        if settings.install_py_dep_per_model:
            # allowed_urls guards downloads, not pip: say so where operators look.
            log.warning("%s", startup_warning(self._pip_sources))

    # --- data plane ----------------------------------------------------------------------

    def _runner(self, model: str, version: str | None = None) -> ModelRunner:
        return self.registry.get(model, version).runner

    def resolve(self, model: str, version: str | None = None) -> ModelRef:
        """The registered version a request names (its default when ``version`` is None);
        raises ``ModelNotFound``, so a transport can answer 404 before reading a body."""
        entry = self.registry.get(model, version)
        return ModelRef(entry.archive.name, entry.archive.version)

    def admit(self, model: str, version: str | None = None) -> ModelRef:
        """``resolve``, then refuse at once (``Overloaded``, ``NoWorkerAvailable``) a request
        the model cannot take now — before a transport reads its body."""
        entry = self.registry.get(model, version)
        entry.runner.check_admission()
        return ModelRef(entry.archive.name, entry.archive.version)

    async def predict(
        self,
        model: str,
        version: str | None,
        parts: list[InputPart],
        headers: dict[str, str],
        on_hang_up: OnHangUp | None = None,
        on_part: OnPredictionPart | None = None,
        *,
        explain: bool = False,
    ) -> Prediction:
        """Queue a request and await its answer (``submit``, then its result)."""
        pending = self.submit(model, version, parts, headers, on_hang_up, on_part, explain=explain)
        with contextlib.suppress(FerryError):  # result() raises it
            await pending.future  # cancelling the caller cancels the request
        return pending.result()

    def submit(
        self,
        model: str,
        version: str | None,
        parts: list[InputPart],
        headers: dict[str, str],
        on_hang_up: OnHangUp | None = None,
        on_part: OnPredictionPart | None = None,
        *,
        explain: bool = False,
    ) -> PendingPrediction:
        """Queue a request; its answer comes when the returned prediction's future is done.
        ``on_hang_up`` lets the transport say when the client goes away: the request is then
        answered with ``ClientGone`` and dropped before it reaches a worker. Parts a handler
        streams go to ``on_part`` as they come; a transport that cannot stream passes none,
        and gets them joined before the last part in the answer's body. ``explain`` asks the
        handler for explanations instead (TorchServe's ``explain: True`` header), alone in
        its batch: a handler looks at the batch's first request to choose."""
        runner = self._runner(model, version)
        loop = asyncio.get_running_loop()
        wire_parts = [messages.InputPart(p.name, p.content_type, p.data) for p in parts]
        budget = deadline_budget(headers)  # bad headers refused before the id is taken
        priority = request_priority(headers)
        request_id = self._choose_request_id(headers.get("x-request-id", ""))
        if explain:
            headers = {**headers, "explain": "True"}
        joined: list[bytes] = []
        if budget is None and runner.settings.client_timeout_ms is not None:
            budget = runner.settings.client_timeout_ms / 1000
        job = Job(
            messages.RequestItem(request_id, headers, wire_parts),
            loop.create_future(),
            self._part_sink(request_id, on_part, joined),
            priority=priority,
        )
        expiry = None
        if budget is not None:
            job.deadline = job.enqueued_at + budget
            expiry = loop.call_later(budget, runner.deadline_passed, job)  # not at dispatch

        def release() -> None:
            self._client_request_ids.discard(request_id)
            if expiry is not None:
                expiry.cancel()

        try:
            if explain:
                runner.submit_alone(job)
            else:
                runner.submit(job)
        except BaseException:
            release()
            raise
        pending = PendingPrediction(
            job, joined, self.settings.max_response_size, runner.metrics, release
        )
        if on_hang_up is not None:
            on_hang_up(lambda: job.fail(ClientGone("the client closed the connection")))
        return pending

    def _part_sink(
        self, request_id: str, on_part: OnPredictionPart | None, joined: list[bytes]
    ) -> Callable[[StreamedPart], None]:
        """Where a request's streamed parts go: the transport, or ``joined`` (bounded by
        ``max_response_size``; past it the request fails)."""
        limit = self.settings.max_response_size

        def sink(part: StreamedPart) -> None:
            if on_part is not None:
                on_part(PredictionPart(part.body, part.content_type, part.status, request_id))
                return
            joined.append(part.body)
            if sum(len(body) for body in joined) > limit:
                raise ResponseTooLarge(f"streamed response exceeds max_response_size {limit} bytes")

        return sink

    def _choose_request_id(self, wanted: str) -> str:
        """The client's id when it is usable: at most 128 visible ASCII characters, not
        in flight already and not of the generated form (``r`` and digits), since ids key
        the jobs a worker holds. Otherwise a generated one."""
        usable = 0 < len(wanted) <= MAX_REQUEST_ID and all(33 <= ord(c) <= 126 for c in wanted)
        generated_form = wanted[:1] == "r" and wanted[1:].isdigit()
        if not usable or generated_form or wanted in self._client_request_ids:
            return next_request_id()
        self._client_request_ids.add(wanted)
        return wanted

    def health(self) -> Health:
        """TorchServe's ``/ping`` rule over the models loaded at start-up: Healthy when each
        has its minimum workers running, Partial Healthy when some run, Unhealthy when none
        do. Models registered later do not change it; their readiness is per model."""
        if self.draining:
            return Health("Draining")
        if self._opening_startup_models:  # listeners serve before models are registered
            return Health("Unhealthy")
        expected = running = 0
        for entry in self.registry.all_versions():
            if entry.loaded_at_startup:
                expected += len(entry.runner.slots)
                running += min(entry.runner.ready_workers, len(entry.runner.slots))
        if running >= expected:
            return Health("Healthy")
        return Health("Partial Healthy" if running > 0 else "Unhealthy")

    def readiness(self, model: str, version: str | None = None) -> Readiness:
        """Whether one model version can take requests now (for orchestrators' probes)."""
        entry = self.registry.get(model, version)
        runner = entry.runner
        ref = ModelRef(entry.archive.name, entry.archive.version)
        if self.draining:
            return Readiness(ref, False, "the server is shutting down")
        if runner.is_ready():
            return Readiness(ref, True)
        reason = runner.last_error() or (
            "no workers: scale the model up" if not runner.slots else "workers are starting"
        )
        return Readiness(ref, False, reason)

    # --- loading -------------------------------------------------------------------------

    def _runner_settings(
        self,
        archive: ModelArchive,
        startup_timeout: float | None,
        sharing_workers: int | None = None,
    ) -> RunnerSettings:
        """``sharing_workers``: with ``cpu_pinning``, how many workers (this model's among
        them) will claim the free cores; None: this model's alone."""
        config, settings = archive.config, self.settings
        cores = self._core_count()
        workers = self._worker_count(archive, cores)
        gpu_ids = model_gpus(self._gpus, config.device_type, config.device_ids, self._next_gpu)
        if gpu_ids and not config.device_ids:
            self._next_gpu += workers
        delay_ms = config.max_batch_delay_ms
        if delay_ms is None:
            delay_ms = settings.default_max_batch_delay_ms
        return RunnerSettings(
            batch_size=config.batch_size or settings.default_batch_size,
            max_batch_delay=delay_ms / 1000,
            workers=workers,
            response_timeout=config.response_timeout or settings.default_response_timeout,
            startup_timeout=_startup_timeout(config.startup_timeout, startup_timeout, config),
            queue_capacity=config.job_queue_size or settings.job_queue_size,
            batch_policy=config.batch_policy or "adaptive",
            latency_objective_ms=config.latency_objective_ms,
            client_timeout_ms=config.client_timeout_ms,
            deadline_action=config.deadline_action or "reject",
            stream_timeout=settings.stream_timeout or None,
            cancel_grace=settings.cancel_grace,
            torch_threads=self._torch_threads(cores, max(1, workers), sharing_workers),
            gpu_ids=gpu_ids,
            max_workers=config.max_workers or workers,
            recycle=RecyclePolicy(
                max_requests=config.max_requests_per_worker,
                max_rss_bytes=None
                if config.max_worker_memory_mb is None
                else config.max_worker_memory_mb << 20,
            ),
        )

    def _core_count(self) -> int:
        """The cores this server's workers share (a Ray replica's: those Ray gave it)."""
        return self._cores or available_cores()

    def _worker_count(self, archive: ModelArchive, cores: int) -> int:
        workers = archive.config.min_workers
        if workers is None:
            default = default_workers_per_model(cores, self._gpus)
            workers = self.settings.default_workers_per_model or default
        return workers

    def _torch_threads(self, cores: int, workers: int, sharing_workers: int | None) -> int:
        """Each worker's share of the cores: of all of them, split between this model's
        workers; with ``cpu_pinning``, of those free, split between the workers that will
        claim them (at start-up every start-up model's), so that each gets cores of its own."""
        unpinned = split_threads(cores, workers)
        if self._pinned_cores is None:
            return unpinned
        sharing = sharing_workers or workers
        return pinned_threads(self._pinned_cores.free_count(), sharing) or unpinned

    def _start(
        self,
        archive: ModelArchive,
        *,
        at_startup: bool,
        startup_timeout: float | None = None,
        sharing_workers: int | None = None,
    ) -> ModelVersion:
        """Register the version and start its workers (without waiting for them).

        Raises ``ConfigError`` if they would take the server past ``max_workers_total``; a
        version refused here leaves nothing unpacked.
        """
        try:
            entry = self._new_version(archive, at_startup, startup_timeout, sharing_workers)
            self.registry.add(entry)
        except FerryError:
            archive.free()
            raise
        entry.runner.start()
        return entry

    def _new_version(
        self,
        archive: ModelArchive,
        at_startup: bool,
        startup_timeout: float | None,
        sharing_workers: int | None,
    ) -> ModelVersion:
        runner_settings = self._runner_settings(archive, startup_timeout, sharing_workers)
        refusal = self._over_worker_limit(archive, runner_settings.workers)
        if refusal is not None:
            raise ConfigError(refusal)
        spec = WorkerSpec(
            model_name=archive.name,
            model_dir=str(archive.model_dir),
            handler=archive.manifest.handler,
            manifest=archive.manifest.document,
            batch_size=runner_settings.batch_size,
            gpu_id=None,
            model_yaml_config=archive.config.raw,
            torch_threads=runner_settings.torch_threads,
            worker_id="w0",
            image_limits=ImageLimits(
                self.settings.limit_max_image_pixels, self.settings.allowed_image_formats
            ),
            package_dirs=[str(archive.packages)] if archive.packages else [],
            envelope=self.settings.service_envelope,
        )
        metrics = self.metrics.for_model(archive.name, archive.version)
        runner = ModelRunner(
            archive.name, archive.version, spec, runner_settings, self._start_worker, metrics
        )
        return ModelVersion(archive, runner, at_startup)

    def _over_worker_limit(
        self, archive: ModelArchive, workers: int, replacing: ModelVersion | None = None
    ) -> str | None:
        """Why ``workers`` for ``archive`` (instead of ``replacing``'s) would be too many."""
        counts = {f"{archive.name} v{archive.version}": workers}
        for entry in self.registry.all_versions():
            if entry is not replacing:
                counts[f"{entry.archive.name} v{entry.archive.version}"] = len(entry.runner.slots)
        limit = self.settings.max_workers_total or default_max_workers_total(available_cores())
        return over_worker_limit(counts, limit)

    async def load_startup_models(self) -> None:
        store, entries = self.settings.model_store, self.settings.models
        if not entries:
            return
        if store is None:
            raise ConfigError("--models needs --model-store")
        # Unpacking runs in a thread: the event loop keeps answering while archives open.
        self._opening_startup_models = True
        try:
            opened = [
                await asyncio.to_thread(self._open_startup_model, store, name, relative)
                for name, relative in self._startup_entries(store, entries)
            ]
            installed = [await self._startup_packages(a) for a in opened if a is not None]
            archives = [archive for archive in installed if archive is not None]
            cores = self._core_count()
            sharing = sum(self._worker_count(archive, cores) for archive in archives)
            started = [
                self._start(archive, at_startup=True, sharing_workers=sharing)
                for archive in archives
            ]
        finally:
            self._opening_startup_models = False
        for archive in archives:
            versions = self.settings.model_overrides.get(archive.name, {})
            if versions.get(archive.version, {}).get("defaultVersion") is True:
                self.registry.set_default(archive.name, archive.version)
        await asyncio.gather(*(entry.runner.wait_started() for entry in started))
        for entry in started:
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
        self._snapshot_changed("startup")

    def startup_archives(self) -> list[tuple[str, ModelArchive]]:
        """The start-up models as ``load_models`` entries naming one version each, with
        their archives opened (``models`` JSON applied) but nothing started: what
        ``ferry serve --ray`` deploys, each to replicas that load it themselves."""
        store, entries = self.settings.model_store, self.settings.models
        if not entries:
            return []
        if store is None:
            raise ConfigError("--models needs --model-store")
        opened = []
        for name, relative in self._startup_entries(store, entries):
            archive = self._open_startup_model(store, name, relative)
            if archive is not None:
                opened.append((f"{archive.name}={relative}", archive))
        return opened

    def _startup_entries(
        self, store: Path, entries: tuple[str, ...]
    ) -> list[tuple[str | None, str]]:
        """``load_models`` entries; a bare model name from the ``models`` JSON loads each
        of its versions from their ``marName`` (TorchServe's config.properties rules)."""
        resolved: list[tuple[str | None, str]] = []
        for name, relative in resolve_model_entries(store, entries):
            versions = self.settings.model_overrides.get(relative) if name is None else None
            if versions and not (store / relative).exists():
                for version in versions.values():
                    resolved.append((relative, str(version.get("marName", f"{relative}.mar"))))
            else:
                resolved.append((name, relative))
        return resolved

    def _open_startup_model(
        self, store: Path, name: str | None, relative: str
    ) -> ModelArchive | None:
        """The archive, or None when it is missing from the store: like TorchServe, Ferry
        logs it and starts without it. Any other problem with it stops start-up."""
        if not (store / relative).exists():
            log.error("model %s not found in the model store %s; not loaded", relative, store)
            return None
        archive = open_model(
            store,
            relative,
            Path(self._work_dir.name),
            name,
            max_unpacked_size=self.settings.max_unpacked_size,
        )
        overrides = self.settings.model_overrides.get(archive.name, {}).get(archive.version)
        if overrides:
            source = f"models[{archive.name}][{archive.version}]"
            config = apply_overrides(archive.config, overrides, source=source)
            archive = dataclasses.replace(archive, config=config)
        return archive

    async def _startup_packages(self, archive: ModelArchive) -> ModelArchive | None:
        """``_with_packages`` for a start-up model; one whose install fails is logged and
        not loaded, and the server starts without it (as TorchServe does)."""
        try:
            return await self._with_packages(archive)
        except PackageInstallFailed as error:
            log.error("model %s not loaded: %s", archive.name, error)
            return None

    async def _with_packages(self, archive: ModelArchive) -> ModelArchive:
        """The archive with its requirements installed, when ``install_py_dep_per_model``
        is on and it has a requirements file; unpacked files are freed if pip fails."""
        if not self.settings.install_py_dep_per_model:
            return archive
        try:
            requirements = requirements_path(archive.model_dir, archive.manifest.requirements_file)
            if requirements is None:
                return archive
            packages = await asyncio.to_thread(
                install_packages,
                archive.name,
                archive.model_dir,
                requirements,
                Path(self._work_dir.name),
                sources=self._pip_sources,
            )
        except BaseException:
            archive.free()
            raise
        return dataclasses.replace(archive, packages=packages)

    # --- management ----------------------------------------------------------------------

    def require_model_api(self) -> None:
        if not self.settings.enable_model_api:
            raise ModelApiDisabled(
                "Model API is disabled: start Ferry with --enable-model-api to register or "
                "unregister models"
            )

    async def _open_for_registration(self, request: RegisterRequest) -> ModelArchive:
        store = self.settings.model_store
        if store is None:
            raise InvalidRequest("no --model-store is configured")
        if request.runtime is not None and request.runtime.lower() != "python":
            raise InvalidRequest(f"runtime {request.runtime!r} is not supported; use python")
        relative, download = request.url, None
        if is_remote(request.url):
            relative = await fetch_archive(request.url, store, self.settings.allowed_urls)
            download = store / relative
        with removed_on_failure(download):  # not a zip, a bad manifest or model-config ...
            archive = await asyncio.to_thread(
                open_model,
                store,
                relative,
                Path(self._work_dir.name),
                request.model_name,
                max_unpacked_size=self.settings.max_unpacked_size,
            )
            if request.handler:
                manifest = dataclasses.replace(archive.manifest, handler=request.handler)
                archive = dataclasses.replace(archive, manifest=manifest)
            config = archive.config.merged(
                batch_size=request.batch_size,
                max_batch_delay_ms=request.max_batch_delay_ms,
                response_timeout=request.response_timeout,
                min_workers=request.initial_workers,
            )
            if config.min_workers is None:
                config = config.merged(min_workers=0)  # TorchServe's default for registration
            archive = dataclasses.replace(archive, config=config, downloaded=download)
            return await self._with_packages(archive)

    async def register(self, request: RegisterRequest) -> Registration:
        """Register a model version; says whether its workers are up already.

        A registration whose workers all fail to load is rolled back (a synchronous one
        raises ``ModelLoadFailed`` with the reason). An archive downloaded for a
        registration that fails is deleted again, so that retrying it works.
        """
        self.require_model_api()
        archive = await self._open_for_registration(request)
        store = self.settings.model_store
        download = store / archive.source if store is not None and is_remote(request.url) else None
        with removed_on_failure(download):  # the version exists already, or cannot load
            entry = self._start(archive, at_startup=False, startup_timeout=request.startup_timeout)
            ref = ModelRef(archive.name, archive.version)
            workers = len(entry.runner.slots)
            if not request.synchronous and workers:
                task = asyncio.create_task(removed_if_fails(download, self._unless_loaded(entry)))
                self._background.add(task)
                task.add_done_callback(self._background_done)
                self._snapshot_changed()
                return Registration(ref, workers, ready=False)
            await self._unless_loaded(entry)
        self._snapshot_changed()
        return Registration(ref, workers, ready=True)

    def _background_done(self, task: asyncio.Task[None]) -> None:
        self._background.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("%s", task.exception())

    async def _unless_loaded(self, entry: ModelVersion) -> None:
        """Once every worker has tried to start: if none could, unregister the version
        again, so a model that cannot load is never left half-registered."""
        runner, archive = entry.runner, entry.archive
        await runner.wait_started()
        if not runner.slots or runner.ready_workers > 0:
            return
        reasons = "; ".join(sorted({slot.last_error for slot in runner.slots}))
        with contextlib.suppress(FerryError):
            if self.registry.get(archive.name, archive.version) is entry:
                self.registry.remove(archive.name, archive.version)
        await runner.stop()
        await asyncio.to_thread(archive.free)  # its workers are gone
        self.metrics.forget_model(archive.name, archive.version)
        raise ModelLoadFailed(f"Model {archive.name} v{archive.version} failed to load: {reasons}")

    async def unregister(self, name: str, version: str | None) -> ModelRef:
        self.require_model_api()
        ref = await self.remove(name, version)
        self._snapshot_changed()
        return ref

    # --- for workflows (``ferry.workflows.manager``), which check the model API first ------

    @property
    def work_dir(self) -> Path:
        """Where this server unpacks archives."""
        return Path(self._work_dir.name)

    async def open_archive(self, url: str, name: str) -> ModelArchive:
        """A workflow node's model: ``url`` from the model store (or downloaded into it,
        when ``allowed_urls`` lets it), unpacked under the name ``name``."""
        store = self.settings.model_store
        if store is None:
            raise InvalidRequest("no --model-store is configured")
        relative, download = url, None
        if is_remote(url):
            relative = await fetch_archive(url, store, self.settings.allowed_urls)
            download = store / relative
        with removed_on_failure(download):
            archive = await asyncio.to_thread(
                open_model,
                store,
                relative,
                Path(self._work_dir.name),
                name,
                max_unpacked_size=self.settings.max_unpacked_size,
            )
        return dataclasses.replace(archive, downloaded=download)

    async def load_archive(self, archive: ModelArchive, startup_timeout: float | None) -> None:
        """Register ``archive`` and wait for its workers; raises ``ModelLoadFailed`` (and
        leaves nothing registered) when none can start."""
        archive = await self._with_packages(archive)
        entry = self._start(archive, at_startup=False, startup_timeout=startup_timeout)
        await self._unless_loaded(entry)

    async def remove(self, name: str, version: str | None = None) -> ModelRef:
        """Unregister a version and stop its workers (no model API check, no snapshot)."""
        entry = self.registry.remove(name, version)
        await entry.runner.stop()
        await asyncio.to_thread(entry.archive.free)  # its workers are gone
        if entry.archive.downloaded is not None:
            entry.archive.downloaded.unlink(missing_ok=True)
        self.metrics.forget_model(entry.archive.name, entry.archive.version)
        return ModelRef(entry.archive.name, entry.archive.version)

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
            refusal = self._over_worker_limit(entry.archive, min_worker, replacing=entry)
            if refusal is not None:
                raise InvalidRequest(refusal)
            # The model's share for its new worker count (registered with none, TorchServe's
            # default, it was a lone worker's: every core, which each new one then took);
            # pinned, the new workers split the cores still free.
            threads = self._torch_threads(self._core_count(), min_worker, added)
            runner.set_torch_threads(threads)
        try:
            await runner.scale(min_worker, max_worker, wait=synchronous)
        except ModelLoadFailed:
            runner.set_torch_threads(threads_before)  # the scale-up was undone
            raise
        self._snapshot_changed()
        ref = ModelRef(entry.archive.name, entry.archive.version)
        return Registration(ref, len(entry.runner.slots), ready=synchronous)

    def set_batch_policy(
        self, name: str, version: str | None, policy: str, latency_objective_ms: float | None
    ) -> ModelRef:
        """Switch the model version's batch policy; queued requests stay and are batched by
        the new one (``InvalidRequest`` for an unknown policy)."""
        entry = self.registry.get(name, version)
        try:
            entry.runner.set_batch_policy(policy, latency_objective_ms)
        except ValueError as exc:
            raise InvalidRequest(str(exc)) from None
        self._snapshot_changed()
        return ModelRef(entry.archive.name, entry.archive.version)

    def set_default(self, name: str, version: str) -> None:
        self.registry.set_default(name, version)
        self._snapshot_changed()

    def snapshot_state(self) -> ServerSnapshot:
        """Every registered version with its source, default flag and scaling: what a
        restart needs to bring the models back (``ferry.snapshots``)."""
        versions = []
        for entry in self.registry.all_versions():
            archive, runner = entry.archive, entry.runner
            if archive.workflow is not None:
                continue  # registered with its workflow, as in TorchServe
            versions.append(
                VersionSnapshot(
                    model=archive.name,
                    version=archive.version,
                    source=archive.source,
                    is_default=self.registry.default_version(archive.name) == archive.version,
                    min_workers=len(runner.slots),
                    max_workers=runner.max_workers,
                    batch_size=runner.settings.batch_size,
                    max_batch_delay_ms=runner.settings.max_batch_delay * 1000,
                    response_timeout=runner.settings.response_timeout,
                    batch_policy=runner.settings.batch_policy,
                    latency_objective_ms=runner.settings.latency_objective_ms,
                )
            )
        return ServerSnapshot(self.settings.model_store, tuple(versions))

    def _snapshot_changed(self, kind: str = "snapshot") -> None:
        """Write a snapshot unless snapshots are off. A few hundred bytes, written in the
        loop; a failure is logged and never fails the change itself."""
        folder = snapshot_folder(self.settings)
        if folder is None:
            return
        try:
            write_snapshot(folder, self.snapshot_state(), kind)
        except OSError as error:
            log.warning("cannot write a model snapshot in %s: %s", folder, error)

    def describe(self, name: str, version: str | None) -> list[ModelStatus]:
        """One version (the default when None), or every version for ``all``."""
        if version == "all":
            entries = self.registry.versions_of(name)
        else:
            entries = [self.registry.get(name, version)]
        return [model_status(entry) for entry in entries]

    async def customized_metadata(self, name: str, version: str | None) -> bytes:
        """What the handler's ``describe_handle`` returns, as TorchServe's describe API with
        ``customized=true`` asks a worker for it: a request alone in its batch with the
        header ``describe: True`` and no input. Raises ``NoWorkerAvailable`` without a
        worker, and what the request failed with otherwise."""
        runner = self._runner(name, version)
        if not runner.ready_workers:
            raise NoWorkerAvailable(
                f'Model "{name}" has no worker to serve describe request. Please use scale '
                "workers API to add workers."
            )
        item = messages.RequestItem(next_request_id(), {"describe": "True"}, [])
        job = Job(item, asyncio.get_running_loop().create_future())
        runner.submit_alone(job)
        answer = await job.future
        return answer.body

    def metadata(self, name: str, version: str | None) -> ModelMetadata:
        """The model's declared tensors (model-config.yaml ``tensor_metadata``: ``inputs``
        and ``outputs``, each a list of ``{name, datatype, shape}``; none when absent)."""
        entry = self.registry.get(name, version)
        declared = entry.archive.config.raw.get("tensor_metadata") or {}
        return ModelMetadata(
            name=entry.archive.name,
            versions=[v.archive.version for v in self.registry.versions_of(name)],
            platform="pytorch",
            inputs=_tensor_specs(declared, "inputs", name),
            outputs=_tensor_specs(declared, "outputs", name),
        )

    def model_names(self) -> list[str]:
        return self.registry.names()

    def all_statuses(self) -> list[ModelStatus]:
        """Every registered version, by model name (the start-up summary)."""
        return [model_status(entry) for entry in self.registry.all_versions()]

    def list_models(self, limit: int, page_token: int) -> ModelPage:
        """A page of models (default versions), TorchServe's paging rules."""
        # Function nodes of workflows have no archive to name; TorchServe leaves them out.
        names = [name for name in self.registry.names() if self.registry.get(name).archive.source]
        page, token = page_of(names, limit, page_token)
        models = [(name, self.registry.get(name).archive.source) for name in page]
        return ModelPage(models, token)

    def metrics_exposition(self) -> str:
        """Prometheus text, with the gauges read now."""
        workers = []
        for entry in self.registry.all_versions():
            runner = entry.runner
            states: dict[str, int] = {}
            for slot in runner.slots:
                states[slot.state.value] = states.get(slot.state.value, 0) + 1
                pid = slot.worker.info.pid if slot.worker is not None else None
                if pid is not None:
                    workers.append((f"{runner.name}/{runner.version}/w{slot.index}", pid))
            runner.metrics.set_queue_and_workers(len(runner.queue), states)
        self.metrics.record_processes(workers)
        self.metrics.record_host()
        if self._gpus:
            self.metrics.record_gpus(read_gpus())
        return self.metrics.exposition()

    async def close(self) -> None:
        for task in self._background:
            task.cancel()
        entries = self.registry.all_versions()
        await asyncio.gather(*(entry.runner.stop() for entry in entries))
        for entry in entries:
            entry.archive.free()
        self._work_dir.cleanup()


def _tensor_specs(declared: object, key: str, model: str) -> list[TensorSpec]:
    entries = declared.get(key, []) if isinstance(declared, dict) else []
    specs = []
    for entry in entries if isinstance(entries, list) else []:
        if isinstance(entry, dict) and isinstance(entry.get("name"), str):
            shape = entry.get("shape", [])
            specs.append(
                TensorSpec(
                    entry["name"],
                    str(entry.get("datatype", "BYTES")),
                    [int(d) for d in shape] if isinstance(shape, list) else [],
                )
            )
        else:
            log.warning("model %s: tensor_metadata.%s entry %r ignored", model, key, entry)
    return specs


def _startup_timeout(
    configured: float | None, requested: float | None, config: ModelConfig
) -> float:
    """TorchServe's precedence: model-config.yaml's ``startupTimeout``, then the
    registration's ``startup_timeout`` (0 included: no worker can start in time), then at
    least 120 s and never less than ``responseTimeout``."""
    if configured:
        return configured
    if requested is not None:
        return requested
    return max(120.0, config.response_timeout or 0.0)


def over_worker_limit(workers: Mapping[str, int], limit: int) -> str | None:
    """Why running ``workers`` (per model version) would exceed ``limit`` in all, or None.

    >>> over_worker_limit({"a v1": 3, "b v1": 6}, 8)
    '9 workers in all (a v1: 3, b v1: 6) exceed the limit of 8 (max_workers_total)'
    """
    total = sum(workers.values())
    if total <= limit:
        return None
    counts = ", ".join(f"{name}: {count}" for name, count in workers.items() if count)
    return f"{total} workers in all ({counts}) exceed the limit of {limit} (max_workers_total)"


def _pinned_cores(pin: bool, shared_cores: int | None) -> CoreAllocator | None:
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


def _local_worker_factory(pinned_cores: CoreAllocator | None) -> WorkerFactory:
    """Workers as local processes; with ``pinned_cores``, each one's torch threads on
    cores of its own among them (``ferry.worker.cpu_pinning``)."""
    from ferry.worker.process import WorkerProcess

    if pinned_cores is None:
        return WorkerProcess.start
    return functools.partial(WorkerProcess.start, cores=pinned_cores)


__all__ = ["FerryService"]
