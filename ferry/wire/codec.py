"""Binary framing and encoding of ``ferry.wire.messages``."""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import Any

import msgpack

from ferry.wire.messages import (
    PROTOCOL_VERSION,
    BatchResult,
    CancelRequests,
    HandlerMetricValue,
    InputPart,
    ItemResult,
    Message,
    PartialResult,
    PredictBatch,
    RequestItem,
    SpecTaken,
    StageWindow,
    StartWorker,
    WorkerLoadFailed,
    WorkerReady,
)

FRAME_HEADER = struct.Struct("!I")
MAX_FRAME = 1 << 31

_PREDICT, _RESULT, _READY, _LOAD_FAILED, _START, _PARTIAL, _CANCEL, _TAKEN = 1, 2, 3, 4, 5, 6, 7, 8


class ProtocolError(Exception):
    """A frame that is not a message of this protocol version."""


def _fields(message: Message) -> tuple[int, list[Any]]:
    if isinstance(message, PredictBatch):
        items = [
            [
                item.request_id,
                item.headers,
                [[p.name, p.content_type, p.data] for p in item.parts],
                item.envelope,
            ]
            for item in message.items
        ]
        return _PREDICT, [message.batch_id, items, message.traceparent]
    if isinstance(message, BatchResult):
        results = [
            [r.request_id, r.body, r.content_type, r.status, r.headers, r.error_kind, r.message]
            for r in message.results
        ]
        metrics = [[m.name, m.value, m.unit, m.kind, m.dimensions] for m in message.metrics]
        windows = [[w.stage, w.start_ns, w.end_ns] for w in message.stage_windows]
        fields = [message.batch_id, results, message.handler_ms, metrics, message.stage_ms]
        return _RESULT, [*fields, windows]
    if isinstance(message, PartialResult):
        m = message
        return _PARTIAL, [m.batch_id, m.request_id, m.body, m.content_type, m.status]
    if isinstance(message, CancelRequests):
        return _CANCEL, [message.batch_id, message.request_ids]
    if isinstance(message, WorkerReady):
        footprint = [message.footprint_bytes, message.gpu_bytes]
        shared = [message.shared_bytes, message.shared_key]
        return _READY, [message.pid, message.device, *footprint, *shared]
    if isinstance(message, StartWorker):
        return _START, [message.spec]
    if isinstance(message, SpecTaken):
        return _TAKEN, [message.pid]
    return _LOAD_FAILED, [message.message]


def encode(message: Message) -> bytes:
    """The whole frame, header included."""
    kind, fields = _fields(message)
    payload: bytes = msgpack.packb([PROTOCOL_VERSION, kind, *fields], use_bin_type=True)
    return FRAME_HEADER.pack(len(payload)) + payload


def decode(payload: bytes) -> Message:
    """Decode a frame's payload (without its header)."""
    try:
        version, kind, *fields = msgpack.unpackb(payload, raw=False)
    except (ValueError, TypeError, msgpack.ExtraData) as exc:
        raise ProtocolError(f"undecodable frame: {exc}") from exc
    if version != PROTOCOL_VERSION:
        raise ProtocolError(f"protocol version {version}, expected {PROTOCOL_VERSION}")
    build = _BUILDERS.get(kind) if isinstance(kind, int) else None
    if build is None:
        raise ProtocolError(f"unknown message kind {kind}")
    try:
        return build(fields)
    except (TypeError, ValueError) as exc:
        raise ProtocolError(f"malformed message of kind {kind}: {exc}") from exc


def _predict_batch(fields: list[Any]) -> PredictBatch:
    batch_id, items, traceparent = fields
    return PredictBatch(
        batch_id,
        [
            RequestItem(rid, headers, [InputPart(*part) for part in parts], envelope)
            for rid, headers, parts, envelope in items
        ],
        traceparent,
    )


def _batch_result(fields: list[Any]) -> BatchResult:
    batch_id, results, handler_ms, metrics, stage_ms, windows = fields
    return BatchResult(
        batch_id,
        [ItemResult(*r) for r in results],
        handler_ms,
        [HandlerMetricValue(*m) for m in metrics],
        stage_ms,
        [StageWindow(*window) for window in windows],
    )


def _cancel_requests(fields: list[Any]) -> CancelRequests:
    batch_id, request_ids = fields
    if not isinstance(request_ids, list):
        raise TypeError("request_ids must be a list")
    return CancelRequests(batch_id, request_ids)


def _start_worker(fields: list[Any]) -> StartWorker:
    (spec,) = fields
    if not isinstance(spec, dict):
        raise TypeError("the spec must be a mapping")
    return StartWorker(spec)


_BUILDERS: dict[int, Callable[[list[Any]], Message]] = {
    _PREDICT: _predict_batch,
    _RESULT: _batch_result,
    _PARTIAL: lambda fields: PartialResult(*fields),
    _CANCEL: _cancel_requests,
    _READY: lambda fields: WorkerReady(*fields),
    _LOAD_FAILED: lambda fields: WorkerLoadFailed(*fields),
    _START: _start_worker,
    _TAKEN: lambda fields: SpecTaken(*fields),
}
"""Each message kind's fields back into its message (``TypeError`` / ``ValueError`` when
they do not fit)."""


def frame_length(header: bytes) -> int:
    (length,) = FRAME_HEADER.unpack(header)
    if length > MAX_FRAME:
        raise ProtocolError(f"frame of {length} bytes exceeds the limit")
    return int(length)
