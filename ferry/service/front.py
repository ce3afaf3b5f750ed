"""``FerryService``: what every transport calls. Requests (``admit``, ``submit``,
``predict``), health and readiness, and the management calls; model versions come and go
in ``ferry.service.lifecycle``, reads of the registry are ``ferry.service.queries``.
Nothing here knows a transport, or how a worker runs.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from typing import Any

from ferry.capacity.sizing import Machine
from ferry.config.settings import ServerSettings
from ferry.errors import (
    ClientGone,
    FerryError,
    ModelApiDisabled,
    ModelNotFound,
    NoWorkerAvailable,
    ResponseTooLarge,
)
from ferry.metrics.definitions import FerryMetrics
from ferry.scheduling.jobs import PredictionPart, next_request_id
from ferry.scheduling.model_runner import ModelRunner
from ferry.scheduling.registry import ModelRegistry
from ferry.scheduling.residency import ModelGone
from ferry.service import queries
from ferry.service.lifecycle import ModelLifecycle
from ferry.service.pending import PendingPrediction
from ferry.service.requests import RequestIds, deadline_budget, request_priority
from ferry.service.status import ModelStatus
from ferry.service.types import (
    Admission,
    Health,
    ModelMetadata,
    ModelPage,
    ModelRef,
    OnPredictionPart,
    Prediction,
    PredictionRequest,
    Readiness,
    RegisterRequest,
    Registration,
)
from ferry.tracing import NO_TRACING, Tracing
from ferry.worker_handles.handle import WorkerFactory


class FerryService:
    """Predict, health and model management, independent of any transport."""

    def __init__(
        self,
        settings: ServerSettings,
        start_worker: WorkerFactory,
        machine: Machine | None = None,
        tracing: Tracing = NO_TRACING,
    ) -> None:
        """``machine``: what the composition root (``ferry.apis``) found the workers may
        use; by default every core this process may run on, and no GPU. ``tracing``: the
        requests' spans (``ferry.tracing``; off by default)."""
        self.settings = settings
        self.tracing = tracing
        self.metrics = FerryMetrics(
            enabled=settings.enable_metrics_api,
            max_handler_series=settings.max_handler_metric_series,
        )
        observer = tracing if tracing.enabled else None  # off: not even a call per request
        self.models = ModelLifecycle(
            settings, start_worker, self.metrics, machine or Machine(None, 0), observer
        )
        self.draining = False
        """Stopping: requests are still served, readiness says no (``drain_delay``)."""
        self._request_ids = RequestIds()

    @property
    def registry(self) -> ModelRegistry:
        return self.models.registry

    # --- requests ------------------------------------------------------------------------

    def _runner(self, model: str, version: str | None = None) -> ModelRunner:
        return self.registry.get(model, version).runner

    def resolve(self, model: str, version: str | None = None) -> ModelRef:
        """The registered version a request names (its default when ``version`` is None);
        raises ``ModelNotFound``, so a transport can answer 404 before reading a body."""
        entry = self.registry.get(model, version)
        return ModelRef(entry.archive.name, entry.archive.version)

    def admit(self, model: str, version: str | None = None) -> Admission:
        """The request's ticket: its model version looked up (``ModelNotFound``) and checked
        able to take it now (``Overloaded``, ``NoWorkerAvailable``), before a transport
        reads its body. ``submit`` and ``predict`` take it."""
        entry = self.registry.get(model, version)
        entry.runner.check_admission()
        return Admission(ModelRef(entry.archive.name, entry.archive.version), entry.runner)

    async def predict(self, admission: Admission, request: PredictionRequest) -> Prediction:
        """Queue a request and await its answer (``submit``, then its result)."""
        pending = self.submit(admission, request)
        with contextlib.suppress(FerryError):  # result() raises it
            await pending.future  # cancelling the caller cancels the request
        return pending.result()

    def submit(self, admission: Admission, request: PredictionRequest) -> PendingPrediction:
        """Queue an admitted request, answered when the returned prediction's future is
        done. The runner checks admission again as it queues it: the queue may have filled,
        or the model lost its workers, while the transport read the body."""
        runner, headers = admission.runner, request.headers
        budget = runner.client_budget(deadline_budget(headers))  # bad headers: before the id
        priority = request_priority(headers)
        request_id = self._request_ids.choose(headers.get("x-request-id", ""))
        headers = {**headers, "explain": "True"} if request.explain else headers
        joined: list[bytes] = []
        limit = self.settings.max_response_size
        sink = request.on_part or _joined_within(joined, limit)
        try:
            job = runner.enqueue(
                request_id,
                headers,
                request.parts,
                sink,
                priority,
                budget,
                alone=request.explain,
                envelope=request.envelope,
            )
        except BaseException:
            self._request_ids.release(request_id)
            raise
        pending = PendingPrediction(job, joined, limit, runner.metrics, self._request_ids.release)
        if request.on_hang_up is not None:
            request.on_hang_up(lambda: job.fail(ClientGone("the client closed the connection")))
        return pending

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
        describe = {"describe": "True"}  # Ferry's own request, not a client's: untraced
        job = runner.enqueue(next_request_id(), describe, [], alone=True, watched=False)
        answer = await job.future
        return answer.body

    # --- health --------------------------------------------------------------------------

    def health(self) -> Health:
        """TorchServe's ``/ping`` rule over the models loaded at start-up: Healthy when each
        has its minimum workers running, Partial Healthy when some run, Unhealthy when none
        do. Models registered later do not change it; their readiness is per model."""
        if self.draining:
            return Health("Draining")
        if self.models.opening_startup_models:  # listeners serve before models register
            return Health("Unhealthy")
        expected = running = 0
        for entry in self.registry.all_versions():
            if entry.loaded_at_startup:
                expected += len(entry.runner.slots)
                running += min(entry.runner.ready_workers, len(entry.runner.slots))
        if running >= expected:
            return Health("Healthy")
        return Health("Partial Healthy" if running > 0 else "Unhealthy")

    def ready(self) -> bool:
        """The Open Inference Protocol's server readiness (``/v2/health/ready``,
        ``ServerReady``): start-up is over and every model loaded at start-up can take
        requests (a worker of each is up), as KServe's "all the models are ready". Unlike
        ``/ping``'s Partial Healthy, a start-up model still loading means not ready; one
        worker of several restarting does not. Models registered later do not change it."""
        if self.draining or not self.models.startup_done:
            return False
        return all(
            entry.runner.is_ready()
            for entry in self.registry.all_versions()
            if entry.loaded_at_startup
        )

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

    # --- management ----------------------------------------------------------------------

    def require_model_api(self) -> None:
        if not self.settings.enable_model_api:
            raise ModelApiDisabled(
                "Model API is disabled: start Ferry with --enable-model-api to register or "
                "unregister models"
            )

    async def load_startup_models(self) -> None:
        await self.models.load_startup_models()

    async def register(self, request: RegisterRequest) -> Registration:
        """``POST /models`` (``ModelLifecycle.register``), when the model API is on."""
        self.require_model_api()
        return await self.models.register(request)

    async def unregister(self, name: str, version: str | None) -> ModelRef:
        self.require_model_api()
        return await self.models.unregister(name, version)

    async def scale(
        self, name: str, version: str | None, min_worker: int, max_worker: int, synchronous: bool
    ) -> Registration:
        return await self.models.scale(name, version, min_worker, max_worker, synchronous)

    def set_batch_policy(
        self, name: str, version: str | None, policy: str, options: Mapping[str, Any]
    ) -> ModelRef:
        return self.models.set_batch_policy(name, version, policy, options)

    def set_default(self, name: str, version: str) -> None:
        self.models.set_default(name, version)

    async def load_model(self, name: str, version: str | None) -> ModelRef:
        """A model loaded on demand made resident now (Ray's multiplexing asks for it);
        raises what its load raised."""
        entry = self.registry.get(name, version)
        try:
            await self.models.residency.ensure_resident(entry.runner.label)
        except ModelGone as gone:
            raise ModelNotFound(str(gone)) from None
        return ModelRef(entry.archive.name, entry.archive.version)

    async def release_model(self, name: str, version: str | None) -> None:
        """Evict a model loaded on demand now if it is idle, else once it is."""
        entry = self.registry.get(name, version)
        await self.models.residency.release(entry.runner.label)

    def describe(self, name: str, version: str | None) -> list[ModelStatus]:
        return queries.describe(self.registry, name, version)

    def all_statuses(self) -> list[ModelStatus]:
        return queries.all_statuses(self.registry)

    def model_names(self) -> list[str]:
        return self.registry.names()

    def list_models(self, limit: int, page_token: int) -> ModelPage:
        return queries.list_models(self.registry, limit, page_token)

    def metadata(self, name: str, version: str | None) -> ModelMetadata:
        return queries.metadata(self.registry, name, version)

    def metrics_exposition(self) -> str:
        if self.tracing.enabled:
            self.metrics.trace_spans_dropped.counter().value = self.tracing.dropped_spans
        return queries.metrics_exposition(self.registry, self.metrics, self.models.machine.gpus)

    async def close(self) -> None:
        await self.models.close()


def _joined_within(joined: list[bytes], limit: int) -> OnPredictionPart:
    """Where the streamed parts of a request whose transport cannot stream go: ``joined``,
    answered with the last part; past ``limit`` bytes the request fails."""
    size = 0

    def join(part: PredictionPart) -> None:
        nonlocal size
        joined.append(part.body)
        size += len(part.body)
        if size > limit:
            raise ResponseTooLarge(f"streamed response exceeds max_response_size {limit} bytes")

    return join


__all__ = ["FerryService"]
