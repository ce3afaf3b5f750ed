"""Span records encoded as an OTLP ``ExportTraceServiceRequest``, in protobuf's wire format.

Written from the OTLP protocol's message definitions (``opentelemetry/proto/trace/v1``,
``common/v1``, ``resource/v1``, ``collector/trace/v1``): field numbers and wire types
only, no generated code. About 3 us a span where the SDK's encoder takes 17 (it builds a
message object per field first); the tests parse the bytes with the generated classes
and compare them with the SDK's own encoding of the same spans.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Mapping, Sequence
from typing import cast

from ferry.tracing.records import (
    BATCH,
    BATCH_LINK,
    KIND_INTERNAL,
    KIND_SERVER,
    REQUEST,
    REQUEST_ID,
    AttributeValue,
    BatchRecord,
    Record,
    RequestRecord,
    SpanFields,
    SpanLink,
    new_span_id,
)

_WIRE_VARINT, _WIRE_FIXED64, _WIRE_BYTES, _WIRE_FIXED32 = 0, 1, 2, 5
_STATUS_ERROR = 2
# Span.flags / Link.flags: the W3C trace flags (sampled) in the low byte, then whether
# the parent's "remote" bit is known (always, here) and whether it was remote.
_FLAG_SAMPLED, _FLAG_HAS_IS_REMOTE, _FLAG_IS_REMOTE = 0x1, 0x100, 0x200

_pack_fixed64 = struct.Struct("<Q").pack
_pack_fixed32 = struct.Struct("<I").pack
_pack_double = struct.Struct("<d").pack
_pack_times = struct.Struct("<BQBQ").pack  # start and end, each after its one-byte tag


def _varint(value: int) -> bytes:
    value &= 0xFFFF_FFFF_FFFF_FFFF  # a negative int64 is sent as its two's complement
    if value < 0x80:
        return _SMALL[value]
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


_SMALL = [bytes((n,)) for n in range(0x80)]


def _tag(field: int, wire_type: int) -> bytes:
    return _varint(field << 3 | wire_type)


def _field(field_tag: bytes, payload: bytes) -> bytes:
    """A length-delimited field: tag, length, payload."""
    return field_tag + _varint(len(payload)) + payload


# Tags, by message (field number, wire type).
_SPAN_TRACE_ID, _SPAN_SPAN_ID = _tag(1, _WIRE_BYTES), _tag(2, _WIRE_BYTES)
_SPAN_TRACE_STATE, _SPAN_PARENT_ID = _tag(3, _WIRE_BYTES), _tag(4, _WIRE_BYTES)
_SPAN_NAME, _SPAN_KIND = _tag(5, _WIRE_BYTES), _tag(6, _WIRE_VARINT)
_SPAN_START, _SPAN_END = _tag(7, _WIRE_FIXED64), _tag(8, _WIRE_FIXED64)
_SPAN_ATTRIBUTE, _SPAN_LINK = _tag(9, _WIRE_BYTES), _tag(13, _WIRE_BYTES)
_SPAN_STATUS, _SPAN_FLAGS = _tag(15, _WIRE_BYTES), _tag(16, _WIRE_FIXED32)
_LINK_TRACE_ID, _LINK_SPAN_ID = _tag(1, _WIRE_BYTES), _tag(2, _WIRE_BYTES)
_LINK_ATTRIBUTE, _LINK_FLAGS = _tag(4, _WIRE_BYTES), _tag(6, _WIRE_FIXED32)
_STATUS_MESSAGE, _STATUS_CODE = _tag(2, _WIRE_BYTES), _tag(3, _WIRE_VARINT)
_KEY_VALUE_KEY, _KEY_VALUE_VALUE = _tag(1, _WIRE_BYTES), _tag(2, _WIRE_BYTES)
_ANY_STRING, _ANY_BOOL = _tag(1, _WIRE_BYTES), _tag(2, _WIRE_VARINT)
_ANY_INT, _ANY_DOUBLE = _tag(3, _WIRE_VARINT), _tag(4, _WIRE_FIXED64)
_RESOURCE_ATTRIBUTE = _tag(1, _WIRE_BYTES)
_SCOPE_NAME, _SCOPE_VERSION = _tag(1, _WIRE_BYTES), _tag(2, _WIRE_BYTES)
_RESOURCE_SPANS_RESOURCE, _RESOURCE_SPANS_SCOPE_SPANS = _tag(1, _WIRE_BYTES), _tag(2, _WIRE_BYTES)
_SCOPE_SPANS_SCOPE, _SCOPE_SPANS_SPAN = _tag(1, _WIRE_BYTES), _tag(2, _WIRE_BYTES)
_REQUEST_RESOURCE_SPANS = _tag(1, _WIRE_BYTES)

_ID_FIELD_16 = _varint(16)
_ID_FIELD_8 = _varint(8)


def _any_value(value: AttributeValue) -> bytes:
    if isinstance(value, bool):  # before int: a bool is an int in Python
        return _ANY_BOOL + _SMALL[int(value)]
    if isinstance(value, int):
        return _ANY_INT + _varint(value)
    if isinstance(value, float):
        return _ANY_DOUBLE + _pack_double(value)
    return _field(_ANY_STRING, str(value).encode())


def _key_value(key: str, value: AttributeValue) -> bytes:
    return _field(_KEY_VALUE_KEY, key.encode()) + _field(_KEY_VALUE_VALUE, _any_value(value))


class _Cache:
    """Encodings of values that recur (span names, a model's attributes), up to a bound:
    a request's own values (its id) would otherwise fill it."""

    BOUND = 4096

    def __init__(self) -> None:
        self.names: dict[str, bytes] = {}
        self.attributes: dict[tuple[bytes, tuple[str, AttributeValue], type], bytes] = {}

    def name(self, name: str) -> bytes:
        encoded = self.names.get(name)
        if encoded is None:
            encoded = _field(_SPAN_NAME, name.encode())
            if len(self.names) < self.BOUND:
                self.names[name] = encoded
        return encoded

    def attribute(self, field_tag: bytes, attribute: tuple[str, AttributeValue]) -> bytes:
        kind = type(attribute[1])
        if kind is float:  # a measurement (a queue wait): seldom seen twice
            return _field(field_tag, _key_value(*attribute))
        # The value's type is in the key: True, 1 and 1.0 are equal keys in Python.
        key = (field_tag, attribute, kind)
        encoded = self.attributes.get(key)
        if encoded is None:
            encoded = _field(field_tag, _key_value(*attribute))
            if len(self.attributes) < self.BOUND:
                self.attributes[key] = encoded
        return encoded


_cache = _Cache()


def _attributes(
    field_tag: bytes, attributes: Iterable[tuple[str, AttributeValue]]
) -> Iterable[bytes]:
    return (_cache.attribute(field_tag, attribute) for attribute in attributes)


def _link(link: SpanLink) -> bytes:
    trace_id, span_id, attributes = link
    parts = [
        _LINK_TRACE_ID + _ID_FIELD_16 + trace_id.to_bytes(16, "big"),
        _LINK_SPAN_ID + _ID_FIELD_8 + span_id.to_bytes(8, "big"),
        *_attributes(_LINK_ATTRIBUTE, attributes),
        _LINK_FLAGS + _pack_fixed32(_FLAG_SAMPLED | _FLAG_HAS_IS_REMOTE),
    ]
    return _field(_SPAN_LINK, b"".join(parts))


_LOCAL_FLAGS = _SPAN_FLAGS + _pack_fixed32(_FLAG_SAMPLED | _FLAG_HAS_IS_REMOTE)
_REMOTE_FLAGS = _SPAN_FLAGS + _pack_fixed32(_FLAG_SAMPLED | _FLAG_HAS_IS_REMOTE | _FLAG_IS_REMOTE)


def encode_span(span: SpanFields) -> bytes:
    """One ``Span`` message (without its own tag and length)."""
    (
        trace_id,
        span_id,
        parent_id,
        name,
        kind,
        start,
        end,
        attributes,
        links,
        error,
        state,
        remote,
    ) = span
    parts = [
        _SPAN_TRACE_ID + _ID_FIELD_16 + trace_id.to_bytes(16, "big"),
        _SPAN_SPAN_ID + _ID_FIELD_8 + span_id.to_bytes(8, "big"),
    ]
    if state:
        parts.append(_field(_SPAN_TRACE_STATE, state.encode()))
    if parent_id:
        parts.append(_SPAN_PARENT_ID + _ID_FIELD_8 + parent_id.to_bytes(8, "big"))
    parts.append(_cache.name(name))
    parts.append(_SPAN_KIND + _SMALL[kind])
    parts.append(_SPAN_START + _pack_fixed64(start) + _SPAN_END + _pack_fixed64(end))
    if attributes:
        parts.extend(_attributes(_SPAN_ATTRIBUTE, attributes))
    if links:
        parts.extend(_link(link) for link in links)
    if error:
        status = _field(_STATUS_MESSAGE, error.encode()) + _STATUS_CODE + _SMALL[_STATUS_ERROR]
        parts.append(_field(_SPAN_STATUS, status))
    parts.append(_REMOTE_FLAGS if remote else _LOCAL_FLAGS)
    return b"".join(parts)


# A request's and a batch's spans, encoded straight from their records (``encode_record``):
# the same bytes as ``encode_span`` of ``spans_of``'s spans, with what recurs prepared once.
_SPAN_ID_8, _PARENT_ID_8 = _SPAN_SPAN_ID + _ID_FIELD_8, _SPAN_PARENT_ID + _ID_FIELD_8
_TRACE_ID_16 = _SPAN_TRACE_ID + _ID_FIELD_16
_START_TAG, _END_TAG = _SPAN_START[0], _SPAN_END[0]
_SERVER_KIND = _SPAN_KIND + _SMALL[KIND_SERVER]
_INTERNAL_KIND = _SPAN_KIND + _SMALL[KIND_INTERNAL]
_QUEUE_NAME_KIND = _field(_SPAN_NAME, b"queue") + _INTERNAL_KIND


def _link_encoding(attributes: tuple[tuple[str, AttributeValue], ...]) -> tuple[bytes, bytes]:
    """A link's encoding around its two ids: what comes before the trace id, and after
    the span id (its attributes and flags). Every link with these attributes has one length."""
    body_after = (
        b"".join(_attributes(_LINK_ATTRIBUTE, attributes))
        + _LINK_FLAGS
        + _pack_fixed32(_FLAG_SAMPLED | _FLAG_HAS_IS_REMOTE)
    )
    length = len(_LINK_TRACE_ID + _ID_FIELD_16) + 16 + len(_LINK_SPAN_ID + _ID_FIELD_8) + 8
    before = _SPAN_LINK + _varint(length + len(body_after)) + _LINK_TRACE_ID + _ID_FIELD_16
    return before, body_after


_TO_BATCH_BEFORE, _TO_BATCH_AFTER = _link_encoding(BATCH_LINK)
_TO_REQUEST_BEFORE, _TO_REQUEST_AFTER = _link_encoding(())
_LINK_SPAN_ID_8 = _LINK_SPAN_ID + _ID_FIELD_8
_REQUEST_ID_KEY = _field(_KEY_VALUE_KEY, REQUEST_ID.encode())


def _request_id_attribute(request_id: str) -> bytes:
    """A request's id attribute: its own, not worth an entry in the cache."""
    value = _field(_ANY_STRING, request_id.encode())
    return _field(_SPAN_ATTRIBUTE, _REQUEST_ID_KEY + _field(_KEY_VALUE_VALUE, value))


def _spans_field(span: bytes) -> bytes:
    return _SCOPE_SPANS_SPAN + _varint(len(span)) + span


def _status(error: str) -> bytes:
    status = _field(_STATUS_MESSAGE, error.encode()) + _STATUS_CODE + _SMALL[_STATUS_ERROR]
    return _field(_SPAN_STATUS, status)


def _child_span(
    trace: bytes, state_field: bytes, parent: bytes, name_and_kind: bytes, start: int, end: int
) -> bytes:
    """A queue or stage span (a new span id, no attributes or links, local), as a
    ``ScopeSpans.spans`` field."""
    span = b"".join(
        (
            trace,
            _SPAN_ID_8,
            new_span_id().to_bytes(8, "big"),
            state_field,
            _PARENT_ID_8,
            parent,
            name_and_kind,
            _pack_times(_START_TAG, start, _END_TAG, end),
            _LOCAL_FLAGS,
        )
    )
    return _spans_field(span)


def _add_links(
    parts: list[bytes], spans: Iterable[tuple[int, int]], before: bytes, after: bytes
) -> None:
    """Links to ``spans`` (trace id, span id), each between ``before`` and ``after``."""
    for trace_id, span_id in spans:
        parts += (
            before,
            trace_id.to_bytes(16, "big"),
            _LINK_SPAN_ID_8,
            span_id.to_bytes(8, "big"),
            after,
        )


def _encode_request(record: RequestRecord) -> bytes:
    """A request record's queue span and request span, each as a ``ScopeSpans.spans``
    field."""
    _, trace_id, span_id, parent_id, name, start, dispatched, end = record[:8]
    of_model, request_id, answer, batches, error, state, remote = record[8:]
    trace = _TRACE_ID_16 + trace_id.to_bytes(16, "big")
    own = span_id.to_bytes(8, "big")
    state_field = _field(_SPAN_TRACE_STATE, state.encode()) if state else b""
    queue = _child_span(trace, state_field, own, _QUEUE_NAME_KIND, start, dispatched or end)
    parts = [trace, _SPAN_ID_8, own, state_field]
    if parent_id:
        parts.append(_PARENT_ID_8 + parent_id.to_bytes(8, "big"))
    parts += (_cache.name(name), _SERVER_KIND, _pack_times(_START_TAG, start, _END_TAG, end))
    parts.extend(_attributes(_SPAN_ATTRIBUTE, of_model))
    parts.append(_request_id_attribute(request_id))
    parts.extend(_attributes(_SPAN_ATTRIBUTE, answer))
    if error:
        parts.append(_cache.attribute(_SPAN_ATTRIBUTE, ("error.type", error)))
    _add_links(parts, batches, _TO_BATCH_BEFORE, _TO_BATCH_AFTER)
    if error:
        parts.append(_status(error))
    parts.append(_REMOTE_FLAGS if remote else _LOCAL_FLAGS)
    return queue + _spans_field(b"".join(parts))


def _encode_batch(record: BatchRecord) -> bytes:
    """A batch record's stage spans and batch span, each as a ``ScopeSpans.spans`` field."""
    _, trace_id, span_id, parent_id, name, start, end, attributes, served = record[:9]
    error, state, stages = record[9:]
    trace = _TRACE_ID_16 + trace_id.to_bytes(16, "big")
    own = span_id.to_bytes(8, "big")
    state_field = _field(_SPAN_TRACE_STATE, state.encode()) if state else b""
    encoded = [
        _child_span(trace, state_field, own, _cache.name(stage) + _INTERNAL_KIND, begin, finish)
        for stage, begin, finish in stages
    ]
    parts = [trace, _SPAN_ID_8, own, state_field]
    if parent_id:
        parts.append(_PARENT_ID_8 + parent_id.to_bytes(8, "big"))
    parts += (_cache.name(name), _INTERNAL_KIND, _pack_times(_START_TAG, start, _END_TAG, end))
    parts.extend(_attributes(_SPAN_ATTRIBUTE, attributes))
    if error:
        parts.append(_cache.attribute(_SPAN_ATTRIBUTE, ("error.type", error)))
    _add_links(parts, served, _TO_REQUEST_BEFORE, _TO_REQUEST_AFTER)
    if error:
        parts.append(_status(error))
    parts.append(_LOCAL_FLAGS)
    encoded.append(_spans_field(b"".join(parts)))
    return b"".join(encoded)


def encode_record(record: Record) -> bytes:
    """The spans a record holds (``ferry.tracing.records.spans_of``), each as a
    ``ScopeSpans.spans`` field."""
    kind = record[0]
    if kind == REQUEST:
        return _encode_request(cast(RequestRecord, record))
    if kind == BATCH:
        return _encode_batch(cast(BatchRecord, record))
    return _spans_field(encode_span(cast(SpanFields, record)))


class RequestEncoder:
    """Encodes batches of spans of one resource (the server) and one instrumentation
    scope (``ferry``); the resource and scope are encoded once."""

    def __init__(
        self, resource: Mapping[str, AttributeValue], scope: str = "ferry", scope_version: str = ""
    ) -> None:
        resource_body = b"".join(_attributes(_RESOURCE_ATTRIBUTE, resource.items()))
        self._resource = _field(_RESOURCE_SPANS_RESOURCE, resource_body)
        scope_body = _field(_SCOPE_NAME, scope.encode())
        if scope_version:
            scope_body += _field(_SCOPE_VERSION, scope_version.encode())
        self._scope = _field(_SCOPE_SPANS_SCOPE, scope_body)

    def encode(self, spans: Sequence[SpanFields]) -> bytes:
        """An ``ExportTraceServiceRequest`` holding ``spans``."""
        return self._request(b"".join(_spans_field(encode_span(span)) for span in spans))

    def encode_records(self, records: Sequence[Record]) -> bytes:
        """An ``ExportTraceServiceRequest`` holding the spans of ``records``."""
        return self._request(b"".join(map(encode_record, records)))

    def _request(self, spans: bytes) -> bytes:
        scope_spans = _field(_RESOURCE_SPANS_SCOPE_SPANS, self._scope + spans)
        return _field(_REQUEST_RESOURCE_SPANS, self._resource + scope_spans)
