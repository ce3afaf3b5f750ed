"""Spans as plain records, and the W3C trace context and sampling rules they follow.

A traced request at no-op speed (about 9,000 a second on two cores) has about 110 us of
CPU in all; OpenTelemetry's SDK spent 35 us creating its two spans and 17 us encoding each
one (measured, SDK 1.45). So Ferry records a span as a tuple (well under a microsecond)
and encodes it itself, off the serving path (``ferry.tracing.otlp_wire``); the SDK is
still what sends it (its exporters, their ``OTEL_EXPORTER_OTLP_*`` settings). Nothing
here imports OpenTelemetry.
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable, Iterable, Mapping
from typing import Literal, NamedTuple, cast

AttributeValue = str | int | float | bool
Attributes = tuple[tuple[str, AttributeValue], ...]

# OTLP's span kinds (opentelemetry/proto/trace/v1/trace.proto, Span.SpanKind).
KIND_INTERNAL = 1
KIND_SERVER = 2


SpanLink = tuple[int, int, Attributes]
"""A link to another span: its trace id, its span id, the link's attributes. A plain
tuple, as are a record's other parts: records cross to the exporter process with
``marshal``."""


class SpanRecord(NamedTuple):
    """One ended span, as exported."""

    trace_id: int
    span_id: int
    parent_id: int  # 0: a root span
    name: str
    kind: int
    start_ns: int  # Unix time, as OpenTelemetry's
    end_ns: int
    attributes: Attributes = ()
    links: tuple[SpanLink, ...] = ()
    error: str = ""  # the error's type: the span's status is ERROR with it as the message
    trace_state: str = ""
    remote_parent: bool = False


SpanFields = tuple[
    int, int, int, str, int, int, int, Attributes, tuple[SpanLink, ...], str, str, bool
]
"""A ``SpanRecord``'s fields as a plain tuple (``marshal`` takes no named tuple)."""

REQUEST: Literal["request"] = "request"
BATCH: Literal["batch"] = "batch"
BATCH_LINK: Attributes = (("ferry.link", "batch"),)
"""The attribute of a request span's link to the batch that served it."""

RequestRecord = tuple[
    Literal["request"],
    int,  # trace id
    int,  # span id
    int,  # parent span id (0: a root)
    str,  # name
    int,  # start (Unix ns)
    int,  # when a worker took it (0: never)
    int,  # end
    Attributes,  # its model's: one tuple for all the model's requests
    str,  # its request id
    Attributes,  # its answer's
    tuple[tuple[int, int], ...],  # the batches that served it (trace id, span id)
    str,  # error (its type's name)
    str,  # trace state
    bool,  # remote parent
]
"""A request's span and its queue span, as the server records them; the exporter puts
their attributes together (``request_attributes``)."""

BatchRecord = tuple[
    Literal["batch"],
    int,  # trace id
    int,  # span id
    int,  # parent span id
    str,  # name
    int,  # start
    int,  # end
    Attributes,
    tuple[tuple[int, int], ...],  # the requests it served (trace id, span id)
    str,  # error (its type's name: an ``error.type`` attribute too)
    str,  # trace state
    tuple[tuple[str, int, int], ...],  # its stages: name, start, end
]
"""A batch's span and its stages' spans, as the server records them."""

Record = SpanFields | RequestRecord | BatchRecord
"""What the server hands the exporter: plain tuples, one per request and one per batch
(``spans_of`` makes their spans), so the event loop builds and sends half as many."""


def span_count(record: Record) -> int:
    """How many spans ``record`` holds."""
    kind = record[0]
    if kind == REQUEST:
        return 2
    if kind == BATCH:
        return 1 + len(cast(BatchRecord, record)[11])
    return 1


def spans_of(records: Iterable[Record]) -> list[SpanFields]:
    """The spans ``records`` hold, as plain tuples (a queue or stage span gets its span
    id here)."""
    spans: list[SpanFields] = []
    for record in records:
        kind = record[0]
        if kind == REQUEST:
            spans.extend(_request_spans(cast(RequestRecord, record)))
        elif kind == BATCH:
            spans.extend(_batch_spans(cast(BatchRecord, record)))
        else:
            spans.append(cast(SpanFields, record))
    return spans


REQUEST_ID = "ferry.request_id"


def error_attributes(error: str) -> Attributes:
    """A failed span's ``error.type`` attribute: its error's type, also its status."""
    return (("error.type", error),) if error else ()


def request_attributes(record: RequestRecord) -> Attributes:
    """A request span's attributes: its model's, its id, its answer's, its error's."""
    error = error_attributes(record[12])
    return (*record[8], (REQUEST_ID, record[9]), *record[10], *error)


def _request_spans(record: RequestRecord) -> tuple[SpanFields, SpanFields]:
    (_, trace_id, span_id, parent_id, name, start, dispatched, end) = record[:8]
    batches, error, state, remote = record[11:]
    attributes = request_attributes(record)
    links = tuple((batch_trace, batch_span, BATCH_LINK) for batch_trace, batch_span in batches)
    queue_end = dispatched or end  # answered from the queue: it waited until then
    return (
        (
            trace_id,
            new_span_id(),
            span_id,
            "queue",
            KIND_INTERNAL,
            start,
            queue_end,
            (),
            (),
            "",
            state,
            False,
        ),
        (
            trace_id,
            span_id,
            parent_id,
            name,
            KIND_SERVER,
            start,
            end,
            attributes,
            links,
            error,
            state,
            remote,
        ),
    )


def _batch_spans(record: BatchRecord) -> list[SpanFields]:
    _, trace_id, span_id, parent_id, name, start, end, attributes, served = record[:9]
    error, state, stages = record[9:]
    spans: list[SpanFields] = [
        (
            trace_id,
            new_span_id(),
            span_id,
            stage,
            KIND_INTERNAL,
            stage_start,
            stage_end,
            (),
            (),
            "",
            state,
            False,
        )
        for stage, stage_start, stage_end in stages
    ]
    links = tuple((request_trace, request_span, ()) for request_trace, request_span in served)
    attributes += error_attributes(error)
    spans.append(
        (
            trace_id,
            span_id,
            parent_id,
            name,
            KIND_INTERNAL,
            start,
            end,
            attributes,
            links,
            error,
            state,
            False,
        )
    )
    return spans


class Parent(NamedTuple):
    """A span context taken from a ``traceparent`` header (or made here)."""

    trace_id: int
    span_id: int
    sampled: bool
    trace_state: str = ""
    remote: bool = True


def new_trace_id() -> int:
    """A random, non-zero 128-bit trace id (as OpenTelemetry's SDK makes them)."""
    return random.getrandbits(128) or 1


def new_span_id() -> int:
    return random.getrandbits(64) or 1


def traceparent(trace_id: int, span_id: int, sampled: bool = True) -> str:
    return f"00-{trace_id:032x}-{span_id:016x}-{'01' if sampled else '00'}"


_TRACEPARENT = re.compile(r"([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})(-.*)?")
_TRACESTATE_MEMBER = re.compile(
    r"[a-z0-9][a-z0-9_\-*/]{0,255}(@[a-z0-9][a-z0-9_\-*/]{0,13})?=[\x20-\x2b\x2d-\x3c\x3e-\x7e]{0,255}[\x21-\x2b\x2d-\x3c\x3e-\x7e]"
)
_TRACESTATE_MAX_MEMBERS = 32


def parent_from_headers(headers: Mapping[str, str]) -> Parent | None:
    """The W3C trace context in ``headers`` (keys lower-cased), or None when absent or
    invalid (then, as the W3C spec says, the request starts a new trace). A malformed
    ``tracestate`` is dropped and the ``traceparent`` kept."""
    header = headers.get("traceparent")
    if header is None:
        return None
    match = _TRACEPARENT.fullmatch(header.strip())
    if match is None:
        return None
    version, trace_hex, span_hex, flags, rest = match.groups()
    if version == "ff" or (version == "00" and rest is not None):
        return None
    trace_id, span_id = int(trace_hex, 16), int(span_hex, 16)
    if trace_id == 0 or span_id == 0:
        return None
    state = _valid_tracestate(headers.get("tracestate", ""))
    return Parent(trace_id, span_id, bool(int(flags, 16) & 1), state)


def _valid_tracestate(header: str) -> str:
    members = [member.strip() for member in header.split(",") if member.strip()]
    if len(members) > _TRACESTATE_MAX_MEMBERS:
        return ""
    if not all(_TRACESTATE_MEMBER.fullmatch(member) for member in members):
        return ""
    return ",".join(members)


Sampler = Callable[[Parent | None, int], bool]
"""Whether a span with this parent (None: a root) and trace id is recorded."""

SAMPLER_NAMES = (
    "always_on",
    "always_off",
    "traceidratio",
    "parentbased_always_on",
    "parentbased_always_off",
    "parentbased_traceidratio",
)


def sampler_from_environment(environ: Mapping[str, str]) -> Sampler:
    """The sampler ``OTEL_TRACES_SAMPLER`` names (OpenTelemetry's six built-in ones;
    parent-based always-on by default), its ratio from ``OTEL_TRACES_SAMPLER_ARG``.
    Raises ValueError for another name or a ratio outside [0, 1]."""
    name = environ.get("OTEL_TRACES_SAMPLER", "parentbased_always_on").strip().lower()
    if name not in SAMPLER_NAMES:
        raise ValueError(
            f"OTEL_TRACES_SAMPLER={name!r}: Ferry samples with one of {', '.join(SAMPLER_NAMES)}"
        )
    root_name = name.removeprefix("parentbased_")
    root: Sampler
    if root_name == "always_on":
        root = _always_on
    elif root_name == "always_off":
        root = _always_off
    else:
        root = _trace_id_ratio(_ratio(environ.get("OTEL_TRACES_SAMPLER_ARG", "1.0")))
    return _parent_based(root) if name.startswith("parentbased_") else root


def _ratio(argument: str) -> float:
    try:
        ratio = float(argument)
    except ValueError:
        ratio = -1.0
    if not 0.0 <= ratio <= 1.0:
        raise ValueError(f"OTEL_TRACES_SAMPLER_ARG={argument!r}: a ratio from 0 to 1")
    return ratio


def _always_on(parent: Parent | None, trace_id: int) -> bool:
    return True


def _always_off(parent: Parent | None, trace_id: int) -> bool:
    return False


def _trace_id_ratio(ratio: float) -> Sampler:
    """OpenTelemetry's rule: the trace id's low 64 bits below ratio * 2**64, so every
    service sampling at a ratio keeps the same traces."""
    bound = round(ratio * 2**64)

    def sample(parent: Parent | None, trace_id: int) -> bool:
        return (trace_id & 0xFFFF_FFFF_FFFF_FFFF) < bound

    return sample


def _parent_based(root: Sampler) -> Sampler:
    def sample(parent: Parent | None, trace_id: int) -> bool:
        return root(parent, trace_id) if parent is None else parent.sampled

    return sample
