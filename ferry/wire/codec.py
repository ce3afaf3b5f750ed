"""Binary framing of ``ferry.wire.messages``: each message's fields as its dataclass
declares them (``ferry.wire.field_codec``), behind its tag and the protocol's version."""

from __future__ import annotations

import struct
import threading
import typing
from collections.abc import Callable
from typing import Any

import msgpack

from ferry.wire.field_codec import class_codec
from ferry.wire.messages import (
    PROTOCOL_VERSION,
    BatchResult,
    CancelRequests,
    Message,
    PartialResult,
    PredictBatch,
    SpecTaken,
    StartWorker,
    WorkerLoadFailed,
    WorkerReady,
)

FRAME_HEADER = struct.Struct("!I")
MAX_FRAME = 1 << 31

TAGS: dict[type[Message], int] = {
    PredictBatch: 1,
    BatchResult: 2,
    WorkerReady: 3,
    WorkerLoadFailed: 4,
    StartWorker: 5,
    PartialResult: 6,
    CancelRequests: 7,
    SpecTaken: 8,
}
"""Each message's tag, the second value of its frame; a new message takes a new tag."""
if set(TAGS) != set(typing.get_args(Message)):  # pragma: no cover (an import-time guard)
    raise RuntimeError("every message of ferry.wire.messages needs a tag")

_ENCODERS: dict[type, Callable[[Any], tuple[Any, ...]]] = {
    kind: class_codec(kind, head=(PROTOCOL_VERSION, tag)).encode for kind, tag in TAGS.items()
}
_DECODERS: dict[int, Callable[[list[Any]], Any]] = {
    tag: class_codec(kind, head=(PROTOCOL_VERSION, tag)).decode for kind, tag in TAGS.items()
}
_packers = threading.local()
"""Each thread's ``Packer``: reusing one halves a small frame's packing time (a
pipelined handler's stage threads stream parts, in-process workers share the process)."""
_PACKER_KEPT_UP_TO = 1 << 20
"""A packer's buffer starts at 1 MiB and never shrinks: one that packed a larger frame
is dropped, not kept at that size."""


class ProtocolError(Exception):
    """A frame that is not a message of this protocol version."""


def encode(message: Message) -> bytes:
    """The whole frame, header included."""
    fields = _ENCODERS[type(message)](message)
    try:
        packer = _packers.packer
    except AttributeError:
        packer = _packers.packer = msgpack.Packer(use_bin_type=True)
    payload: bytes = packer.pack(fields)  # resets itself after an error too
    if len(payload) > _PACKER_KEPT_UP_TO:  # its buffer grew to this frame's size: let it go
        del _packers.packer
    return FRAME_HEADER.pack(len(payload)) + payload


def decode(payload: bytes) -> Message:
    """Decode a frame's payload (without its header)."""
    try:
        values = msgpack.unpackb(payload, raw=False)
    except (ValueError, TypeError, msgpack.ExtraData) as exc:
        raise ProtocolError(f"undecodable frame: {exc}") from exc
    if type(values) is not list or len(values) < 2:
        raise ProtocolError("undecodable frame: not an array of a version, a tag and fields")
    version, tag = values[0], values[1]
    if version != PROTOCOL_VERSION:
        raise ProtocolError(f"protocol version {version}, expected {PROTOCOL_VERSION}")
    build = _DECODERS.get(tag) if isinstance(tag, int) else None
    if build is None:
        raise ProtocolError(f"unknown message kind {tag}")
    try:
        message: Message = build(values)
    except (TypeError, ValueError) as exc:
        raise ProtocolError(f"malformed message of kind {tag}: {exc}") from exc
    except KeyError as exc:
        raise ProtocolError(f"malformed message of kind {tag}: no member has {exc}") from exc
    return message


def frame_length(header: bytes) -> int:
    (length,) = FRAME_HEADER.unpack(header)
    if length > MAX_FRAME:
        raise ProtocolError(f"frame of {length} bytes exceeds the limit")
    return int(length)
