"""The ``context`` a handler receives: TorchServe's ``ts.context.Context`` interface."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from ferry import __version__
from ferry.config.image_limits import ImageLimits
from ferry.config.settings import ModelMetric
from ferry.handlers.contract.exceptions import RequestCancelled
from ferry.handlers.contract.metrics import HandlerMetrics

SEQUENCE_ID_HEADER = "ts_request_sequence_id"
"""The request header naming a stateful model's sequence (``sequenceBatching``)."""
SEQUENCE_START_HEADER = "ts_request_sequence_start"
"""``true`` on a sequence's first request when the server named the sequence."""
SEQUENCE_END_HEADER = "ts_request_sequence_end"
"""On a request: its client's last of the sequence (Ferry). On an answer: the sequences
(``;``-separated) the handler ends."""


class RequestProcessor:
    """Per-request headers in, response status / headers out."""

    def __init__(self, request_header: dict[str, str]) -> None:
        self._request_header = request_header
        self._status_code = 200
        self._reason_phrase: str | None = None
        self._response_header: dict[str, str] = {}

    def get_request_property(self, key: str) -> str | None:
        return self._request_header.get(key.lower())

    def get_request_properties(self) -> dict[str, str]:
        return self._request_header

    def report_status(self, code: int, reason: str | None = None) -> None:
        self._status_code = code
        self._reason_phrase = reason

    def get_response_status_code(self) -> int:
        return self._status_code

    def get_response_status_phrase(self) -> str | None:
        return self._reason_phrase

    def add_response_property(self, key: str, value: str) -> None:
        self._response_header[key] = value

    def get_response_headers(self) -> dict[str, str]:
        return self._response_header

    def get_response_header(self, key: str) -> str | None:
        return self._response_header.get(key)


@dataclass(frozen=True)
class IntermediateResponse:
    """One part a handler streamed before its final answer."""

    request_id: str
    output: Any
    status: int
    message: str


def _never(request_id: str) -> bool:
    return False


PartialSender = Callable[[IntermediateResponse], None]
"""Where a worker sends a handler's streamed parts (see ``Context.send_intermediate``)."""


class Context:
    """What a handler knows about its model, worker and current batch."""

    def __init__(
        self,
        model_name: str,
        model_dir: str,
        manifest: dict[str, Any],
        batch_size: int,
        gpu: int | None,
        mms_version: str = __version__,
        limit_max_image_pixels: bool = True,
        metrics: HandlerMetrics | None = None,
        model_yaml_config: dict[str, Any] | None = None,
        image_limits: ImageLimits | None = None,
        model_metrics: Iterable[ModelMetric] | None = None,
    ) -> None:
        self.model_name = model_name
        self.manifest = manifest
        self._system_properties: dict[str, Any] = {
            "model_dir": model_dir,
            "gpu_id": gpu,
            "batch_size": batch_size,
            "server_name": "Ferry",
            "server_version": mms_version,
            "limit_max_image_pixels": limit_max_image_pixels,
        }
        self.request_ids: dict[int, str] = {}
        self.stage_ms: dict[str, float] = {}
        """Time per handler stage in the current batch (preprocess, inference, postprocess)."""
        self.stage_windows: list[tuple[str, int, int]] = []
        """Each stage call of the current batch: its name, start and end (wall clock, ns)."""
        self.request_processor: list[RequestProcessor] = []
        self.metrics = metrics if metrics is not None else HandlerMetrics(model_name, model_metrics)
        """The handler's metrics: ``model_metrics`` (the server's metrics_config, TorchServe's
        default ones when None) declared, ``ModelName`` this model's name."""
        if not self.metrics.model_name:
            self.metrics.model_name = model_name
        self.model_yaml_config: dict[str, Any] = model_yaml_config or {}
        self.image_limits = image_limits or ImageLimits()
        """The server's image settings, which the built-in vision handlers enforce."""
        self.intermediate_responses: list[IntermediateResponse] = []
        """Parts streamed while no worker listens (a handler's unit test reads them here)."""
        self._partial_sender: PartialSender | None = None
        self._cancelled: Callable[[str], bool] = _never
        # The headers of stateful sequences, named as TorchServe's (always these: the
        # frontend reads and writes these names).
        self.header_key_sequence_id = SEQUENCE_ID_HEADER
        self.header_key_sequence_start = SEQUENCE_START_HEADER
        self.header_key_sequence_end = SEQUENCE_END_HEADER
        self.stopping_criteria: Any = None
        """TorchServe's continuous-batching hook; kept for handlers that set it."""

    def stream_to(
        self, sender: PartialSender | None, cancelled: Callable[[str], bool] | None = None
    ) -> None:
        """Send streamed parts to ``sender`` (the worker's connection) from now on;
        ``cancelled`` tells which of the batch's requests lost their client."""
        self._partial_sender = sender
        self._cancelled = cancelled or _never

    def is_cancelled(self, request_id: str) -> bool:
        """Whether the client of ``request_id`` (of the current batch) went away while
        its answer streamed: a handler may stop working for it."""
        return self._cancelled(request_id)

    def send_intermediate(self, part: IntermediateResponse) -> None:
        """Stream one part of a request's answer ahead of the final one. A part for a
        request whose client went away is dropped; once every request of the batch has
        lost its client, ``RequestCancelled`` stops the handler."""
        if part.request_id not in self.request_ids.values():
            raise ValueError(f"request {part.request_id!r} is not in the current batch")
        if self._cancelled(part.request_id):
            if all(self._cancelled(rid) for rid in self.request_ids.values()):
                raise RequestCancelled("every client of this batch went away")
            return
        if self._partial_sender is None:
            self.intermediate_responses.append(part)
        else:
            self._partial_sender(part)

    @property
    def system_properties(self) -> dict[str, Any]:
        return self._system_properties

    def start_batch(self, request_ids: list[str], headers: list[dict[str, str]]) -> None:
        """Reset per-request state for the next batch (called by the worker)."""
        self.request_ids = dict(enumerate(request_ids))
        self.stage_ms = {}
        self.stage_windows = []
        self.request_processor = [RequestProcessor(h) for h in headers]

    def add_stage_time(self, stage: str, ms: float, started_ns: int | None = None) -> None:
        """``ms`` more in ``stage``; ``started_ns`` (``time.time_ns()``) when it began, else
        it is taken to have ended now."""
        self.stage_ms[stage] = self.stage_ms.get(stage, 0.0) + ms
        duration_ns = int(ms * 1_000_000)
        start = started_ns if started_ns is not None else time.time_ns() - duration_ns
        self.stage_windows.append((stage, start, start + duration_ns))

    def get_request_id(self, idx: int = 0) -> str | None:
        return self.request_ids.get(idx)

    def get_sequence_id(self, idx: int) -> str | None:
        """The stateful sequence request ``idx`` belongs to (``sequenceBatching``)."""
        return self.get_request_header(idx, self.header_key_sequence_id)

    def get_request_header(self, idx: int, key: str) -> str | None:
        return self.request_processor[idx].get_request_property(key)

    def get_all_request_header(self, idx: int) -> dict[str, str]:
        return self.request_processor[idx].get_request_properties()

    def set_response_content_type(self, idx: int, value: str) -> None:
        self.set_response_header(idx, "content-type", value)

    def get_response_content_type(self, idx: int) -> str | None:
        return self.get_response_headers(idx).get("content-type")

    def get_response_status(self, idx: int) -> tuple[int, str | None]:
        processor = self.request_processor[idx]
        return processor.get_response_status_code(), processor.get_response_status_phrase()

    def set_response_status(self, code: int = 200, phrase: str = "", idx: int = 0) -> None:
        if 0 <= idx < len(self.request_processor):
            self.request_processor[idx].report_status(code, phrase)

    def set_all_response_status(self, code: int = 200, phrase: str = "") -> None:
        for processor in self.request_processor:
            processor.report_status(code, phrase)

    def get_response_headers(self, idx: int) -> dict[str, str]:
        return self.request_processor[idx].get_response_headers()

    def set_response_header(self, idx: int, key: str, value: str) -> None:
        self.request_processor[idx].add_response_property(key.lower(), value)
