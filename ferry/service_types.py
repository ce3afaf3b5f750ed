"""What the service's public calls take and return. Transports (``ferry.http``, and later
gRPC) speak only these and ``ferry.errors``; they never import scheduling or worker types.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field


@dataclass(frozen=True)
class InputPart:
    """One input of a request: the raw body (``name="body"``) or one form field."""

    name: str
    content_type: str
    data: bytes


@dataclass(frozen=True)
class Prediction:
    """A handler's answer to one request."""

    body: bytes
    content_type: str
    status: int = 200
    headers: dict[str, str] = field(default_factory=dict)
    batch_size: int = 1
    """How many requests shared this request's batch."""
    queued_seconds: float = 0.0
    request_id: str = ""
    """The id the request ran under: the client's ``x-request-id`` or a generated one."""


@dataclass(frozen=True)
class PredictionPart:
    """A part of the answer a handler streamed ahead of its last one
    (``send_intermediate_predict_response``)."""

    body: bytes
    content_type: str
    status: int
    request_id: str


OnPredictionPart = Callable[[PredictionPart], None]


@dataclass(frozen=True)
class ModelRef:
    """A registered model version, resolved (the default version when none was named)."""

    name: str
    version: str


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


__all__ = [
    "Health",
    "InputPart",
    "ModelMetadata",
    "ModelPage",
    "ModelRef",
    "OnPredictionPart",
    "Prediction",
    "PredictionPart",
    "Readiness",
    "RegisterRequest",
    "Registration",
    "TensorSpec",
]
