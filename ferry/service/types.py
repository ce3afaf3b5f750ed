"""What the service's public calls take and return. Transports (``ferry.http``,
``ferry.grpc``, ``ferry.ray_serve``) speak only these and ``ferry.errors``; they never
import scheduling or worker types.

A request's parts, its answer and the parts a handler streams are each defined once, at the
lowest layer that carries them, and named here for the transports: ``InputPart`` travels to
the worker as it is (``ferry.wire.messages``), ``Prediction`` and ``PredictionPart`` are
what a job's future and its stream hold (``ferry.scheduling.jobs``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from ferry.scheduling.jobs import InputPart, OnPredictionPart, Prediction, PredictionPart
from ferry.scheduling.model_runner import ModelRunner
from ferry.service.status import ModelStatus

OnHangUp = Callable[[Callable[[], None]], None]
"""Registers a callback the transport calls if the client goes away before its answer."""


@dataclass(frozen=True)
class ModelRef:
    """A registered model version, resolved (the default version when none was named)."""

    name: str
    version: str


@dataclass(frozen=True)
class Admission:
    """A model version found and able to take a request now (``FerryService.admit``): the
    ticket ``submit`` and ``predict`` take, so a request looks its model up once. Taken
    before a transport reads the body, so a refusal (404, 503) costs no read."""

    model: ModelRef
    runner: ModelRunner = field(repr=False, compare=False)
    """The service's own: transports hand the ticket back whole."""

    @property
    def version(self) -> str:
        return self.model.version


@dataclass(frozen=True)
class PredictionRequest:
    """One prediction, as every transport hands it to the service."""

    parts: list[InputPart]
    headers: dict[str, str]
    """Lower-case names (HTTP's, gRPC metadata's)."""
    on_hang_up: OnHangUp | None = None
    """Where the transport says its client went (the request is answered ``ClientGone``)."""
    on_part: OnPredictionPart | None = None
    """Where streamed parts go; without it they are joined before the answer."""
    explain: bool = False
    """TorchServe's ``explain: True``, alone in its batch (handlers read its first request)."""
    envelope: str = ""
    """The request envelope its protocol is read with (KServe's routes)."""


@dataclass(frozen=True)
class TensorSpec:
    """One input or output a model declares (model-config.yaml ``tensor_metadata``)."""

    name: str
    datatype: str
    shape: list[int]


@dataclass(frozen=True)
class ModelMetadata:
    """What the Open Inference Protocol's model metadata call answers."""

    name: str
    versions: list[str]
    platform: str
    inputs: list[TensorSpec]
    outputs: list[TensorSpec]


@dataclass(frozen=True)
class Health:
    """The server's health, by TorchServe's ``/ping`` rule."""

    status: str
    """``Healthy``, ``Partial Healthy``, ``Unhealthy``, or ``Draining`` (stopping: still
    serving what it gets, but a load balancer should send nothing more)."""

    @property
    def ok(self) -> bool:
        return self.status not in ("Unhealthy", "Draining")


@dataclass(frozen=True)
class Readiness:
    """Whether one model version can take requests now, and if not, why."""

    model: ModelRef
    ready: bool
    reason: str = ""


@dataclass(frozen=True)
class RegisterRequest:
    """``POST /models``: TorchServe's parameters; None means "from the archive or default"."""

    url: str
    model_name: str | None = None
    handler: str | None = None
    runtime: str | None = None
    batch_size: int | None = None
    max_batch_delay_ms: float | None = None
    initial_workers: int | None = None
    synchronous: bool = False
    response_timeout: float | None = None
    startup_timeout: float | None = None


@dataclass(frozen=True)
class Registration:
    """A model version just registered (or scaled): its workers, and whether they are up."""

    model: ModelRef
    workers: int
    ready: bool


def page_of(names: list[str], limit: int, page_token: int) -> tuple[list[str], str | None]:
    """TorchServe's paging of list calls (models, workflows): ``limit`` outside 0..100
    means 100; the next token is the offset after this page, while names remain."""
    if limit > 100 or limit < 0:
        limit = 100
    start = max(0, page_token)
    page = names[start : start + limit]
    end = start + len(page)
    return page, str(end) if page and end < len(names) else None


@dataclass(frozen=True)
class ModelPage:
    models: list[tuple[str, str]]
    """(model name, archive of its default version)."""
    next_page_token: str | None


class ModelOperations(Protocol):
    """The management calls answered whatever runs the models: ``FerryService`` (workers
    on this machine) and ``ferry serve --ray``'s driver (``ferry.ray_serve.models``: Ray
    Serve deployments), so that one HTTP adapter serves both."""

    def list_models(self, limit: int, page_token: int) -> ModelPage:
        """A page of models (default versions), TorchServe's paging rules."""

    def describe(self, name: str, version: str | None) -> list[ModelStatus]:
        """One version (the default when None), or every version for ``all``."""

    async def scale(
        self, name: str, version: str | None, min_worker: int, max_worker: int, synchronous: bool
    ) -> Registration:
        """Run ``min_worker`` workers (up to ``max_worker``)."""


__all__ = [
    "Admission",
    "Health",
    "InputPart",
    "ModelMetadata",
    "ModelOperations",
    "ModelPage",
    "ModelRef",
    "ModelStatus",
    "OnHangUp",
    "OnPredictionPart",
    "Prediction",
    "PredictionPart",
    "Readiness",
    "RegisterRequest",
    "Registration",
    "TensorSpec",
]
