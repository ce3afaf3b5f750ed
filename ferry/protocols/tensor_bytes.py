"""Tensor elements as bytes: checked in the frontend without unpacking them, unpacked into
the handler's lists only in the worker, in one numpy call.

A V2 request (REST's binary extension, gRPC's ``raw_input_contents``) can carry millions of
elements in a few megabytes. Unpacked into Python lists and re-encoded as JSON, 6 MB of
BOOLs cost the frontend 160 MB and the worker 540 MB. So the frontend keeps each binary
input as the bytes it came in, checks that they hold the elements its shape declares, and
hands the worker a *tensor payload*: the handler's JSON document without those inputs'
``data``, then their bytes (``pack_request``). The worker rebuilds the document the handler
has always received (``unpack_request``): the lists are made once, where they are used.
"""

from __future__ import annotations

import base64
import json
import struct
from collections.abc import Iterator
from typing import Any

import numpy as np

from ferry.errors import InvalidInput
from ferry.protocols import untrusted_json

PAYLOAD_TYPE = "application/vnd.ferry.v2-tensors"
"""The media type of a tensor payload; its ``json-length`` parameter splits the JSON
document from the inputs' bytes."""

FIXED_TYPES: dict[str, tuple[str, str, int]] = {
    "BOOL": ("?", "?", 1),
    "UINT8": ("B", "<u1", 1),
    "UINT16": ("H", "<u2", 2),
    "UINT32": ("I", "<u4", 4),
    "UINT64": ("Q", "<u8", 8),
    "INT8": ("b", "<i1", 1),
    "INT16": ("h", "<i2", 2),
    "INT32": ("i", "<i4", 4),
    "INT64": ("q", "<i8", 8),
    "FP16": ("e", "<f2", 2),
    "FP32": ("f", "<f4", 4),
    "FP64": ("d", "<f8", 8),
    "BF16": ("", "<u2", 2),
}
"""datatype -> (struct code, numpy dtype, bytes) of one little-endian element; BYTES
elements are each a 4-byte length, then the bytes."""


def element_count(raw: bytes | memoryview, datatype: str, name: str) -> int:
    """How many elements ``raw`` holds, checked without unpacking them (``InvalidInput``
    when the bytes are not whole elements)."""
    if datatype == "BYTES":
        return sum(1 for _ in _bytes_elements(raw, name))
    *_, width = FIXED_TYPES[datatype]
    if len(raw) % width:
        raise InvalidInput(f"input {name!r}: {len(raw)} bytes is not a whole number of {datatype}")
    return len(raw) // width


def to_list(raw: bytes | memoryview, datatype: str, name: str) -> list[Any]:
    """The elements as a flat Python list. BYTES elements become base64 text, as KServe's
    wrapper handed them to TorchServe: JSON cannot carry raw bytes."""
    if datatype == "BYTES":
        return [base64.b64encode(item).decode() for item in _bytes_elements(raw, name)]
    element_count(raw, datatype, name)
    if datatype == "BOOL":  # any non-zero byte is true, as C reads a bool
        return (np.frombuffer(raw, dtype=np.uint8) != 0).tolist()  # type: ignore[no-any-return]
    _, dtype, _ = FIXED_TYPES[datatype]
    values = np.frombuffer(raw, dtype=dtype)
    if datatype == "BF16":  # the top half of a float32
        values = (values.astype("<u4") << 16).view("<f4")
    return values.tolist()  # type: ignore[no-any-return]


def encode(data: list[Any], datatype: str) -> bytes:
    """Flat elements as little-endian bytes (``struct.error``, ``TypeError`` or
    ``ValueError`` when one is not of ``datatype``)."""
    if datatype == "BYTES":
        items = [_element_bytes(v) for v in data]
        return b"".join(struct.pack("<I", len(item)) + item for item in items)
    if datatype == "BF16":
        words = [struct.unpack("<I", struct.pack("<f", v))[0] >> 16 for v in data]
        return struct.pack(f"<{len(words)}H", *words)
    code, _, _ = FIXED_TYPES[datatype]
    return struct.pack(f"<{len(data)}{code}", *data)


def _element_bytes(value: Any) -> bytes:
    """One BYTES element: text as UTF-8, bytes as they are, a JSON value (an object a
    TorchServe envelope answers) as its JSON."""
    if isinstance(value, str):
        return value.encode()
    if isinstance(value, dict | list):
        return json.dumps(value).encode()
    return bytes(value)


def _bytes_elements(raw: bytes | memoryview, name: str) -> Iterator[memoryview]:
    view = memoryview(raw)
    offset = 0
    while offset < len(view):
        if offset + 4 > len(view):
            raise InvalidInput(f"input {name!r}: a BYTES element's length is cut off")
        (length,) = struct.unpack_from("<I", view, offset)
        offset += 4
        if offset + length > len(view):
            raise InvalidInput(f"input {name!r}: a BYTES element runs past its data")
        yield view[offset : offset + length]
        offset += length


# --- the tensor payload between frontend and worker --------------------------------------


def pack_request(
    document: dict[str, Any], binary: dict[int, bytes | memoryview]
) -> tuple[bytes, str]:
    """A handler document whose inputs at the indexes of ``binary`` carry no ``data``,
    and those inputs' bytes: the payload and its content type. ``InvalidInput`` when the
    document cannot be written (nested too deeply)."""
    header = {"document": document, "binary": [[i, len(raw)] for i, raw in binary.items()]}
    try:
        text = json.dumps(header).encode()
    except (RecursionError, ValueError) as exc:
        raise InvalidInput(f"the request cannot be encoded: {_reason(exc)}") from None
    payload = b"".join([text, *binary.values()])
    return payload, f"{PAYLOAD_TYPE}; json-length={len(text)}"


def unpack_request(data: bytes, content_type: str) -> dict[str, Any]:
    """The handler document ``pack_request`` was given, binary inputs' ``data`` unpacked."""
    length = _json_length(content_type)
    header = untrusted_json.loads(data[:length])
    document: dict[str, Any] = header["document"]
    view, offset = memoryview(data), length
    for index, size in header["binary"]:
        tensor = document["inputs"][index]
        raw = view[offset : offset + size]
        tensor["data"] = to_list(raw, tensor["datatype"], tensor["name"])
        offset += size
    return document


def _json_length(content_type: str) -> int:
    for parameter in content_type.split(";")[1:]:
        key, _, value = parameter.strip().partition("=")
        if key == "json-length":
            return int(value)
    raise ValueError(f"{PAYLOAD_TYPE} without json-length")


def _reason(exc: BaseException) -> str:
    return "nested too deeply" if isinstance(exc, RecursionError) else str(exc)


__all__ = [
    "FIXED_TYPES",
    "PAYLOAD_TYPE",
    "element_count",
    "encode",
    "pack_request",
    "to_list",
    "unpack_request",
]
