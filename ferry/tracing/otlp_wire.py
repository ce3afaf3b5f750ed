"""Span records encoded as an OTLP ``ExportTraceServiceRequest``, in protobuf's wire format.

Written from the OTLP protocol's message definitions (``opentelemetry/proto/trace/v1``,
``common/v1``, ``resource/v1``, ``collector/trace/v1``): field numbers and wire types
only, no generated code. One encoder for every span, records' included (their spans come
from ``spans_of``): a span costs about a fifth of the SDK's encoder, which builds a message
object per field first (``tests/unit/test_trace_records.py`` parses the bytes with the
generated classes and compares them with the SDK's own encoding of the same spans).
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Mapping, Sequence

from ferry.tracing.records import AttributeValue, Record, SpanFields, SpanLink, spans_of

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


def encode_record(record: Record) -> bytes:
    """The spans a record holds (``ferry.tracing.records.spans_of``), each as a
    ``ScopeSpans.spans`` field."""
    return b"".join(_spans_field(encode_span(span)) for span in spans_of((record,)))


def _spans_field(span: bytes) -> bytes:
    return _SCOPE_SPANS_SPAN + _varint(len(span)) + span


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
