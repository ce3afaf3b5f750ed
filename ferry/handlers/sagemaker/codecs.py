"""The payload formats SageMaker's default ``input_fn`` and ``output_fn`` read and write:
JSON, CSV and NPY, chosen by the request's ``Content-Type`` and ``Accept``.

Decoding gives a NumPy array; encoding takes anything array-like (nested lists, NumPy
arrays, scalars). A type outside the three raises ``UnsupportedFormat``, which the handler
answers as the toolkit does (500, naming the type). Media types are compared without their
parameters and case (``application/json; charset=utf-8`` is JSON); the toolkit compares
the header as sent.

    >>> decode(b"[[1, 2]]", "application/json").shape
    (1, 2)
    >>> encode([[1, 2]], "text/csv")
    b'1,2\\n'
"""

from __future__ import annotations

import io
import json
from collections.abc import Callable
from typing import Any

import numpy as np

JSON = "application/json"
CSV = "text/csv"
NPY = "application/x-npy"
ANY = "*/*"
TEXT_TYPES = frozenset({JSON, CSV})
"""Formats whose bodies the toolkit hands to ``input_fn`` as ``str`` (UTF-8), not bytes."""


class UnsupportedFormat(Exception):
    """A ``Content-Type`` or ``Accept`` the default functions cannot read or write."""

    def __init__(self, content_type: str) -> None:
        super().__init__(
            f"content type {content_type!r} is not one the default input_fn and output_fn "
            f"read or write ({JSON}, {CSV}, {NPY}); define input_fn or output_fn in the "
            "model's inference.py to handle it"
        )
        self.content_type = content_type


def media_type(header: str | None) -> str:
    """``Content-Type: Application/JSON; charset=utf-8`` → ``application/json``."""
    return (header or "").split(";", 1)[0].strip().lower()


def as_text(data: bytes | bytearray | str) -> str:
    return data if isinstance(data, str) else bytes(data).decode("utf-8")


def _as_bytes(data: bytes | bytearray | str) -> bytes:
    return data.encode("utf-8") if isinstance(data, str) else bytes(data)


def _from_json(data: bytes | bytearray | str) -> np.ndarray[Any, Any]:
    return np.array(json.loads(as_text(data)))


def _from_csv(data: bytes | bytearray | str) -> np.ndarray[Any, Any]:
    return np.genfromtxt(io.StringIO(as_text(data)), delimiter=",")


def _from_npy(data: bytes | bytearray | str) -> np.ndarray[Any, Any]:
    # Never pickles: an object array in a request body would run the client's code here.
    array: np.ndarray[Any, Any] = np.load(io.BytesIO(_as_bytes(data)), allow_pickle=False)
    return array


def _to_json(value: Any) -> bytes:
    def plain(item: Any) -> Any:
        if hasattr(item, "tolist"):  # NumPy arrays and scalars, tensors
            return item.tolist()
        raise TypeError(f"{type(item).__name__} is not JSON serialisable")

    return json.dumps(value, default=plain).encode("utf-8")


def _to_csv(value: Any) -> bytes:
    stream = io.StringIO()
    np.savetxt(stream, np.asarray(value), delimiter=",", fmt="%s")
    return stream.getvalue().encode("utf-8")


def _to_npy(value: Any) -> bytes:
    stream = io.BytesIO()
    np.save(stream, np.asarray(value), allow_pickle=False)
    return stream.getvalue()


_DECODERS: dict[str, Callable[[bytes | bytearray | str], np.ndarray[Any, Any]]] = {
    JSON: _from_json,
    CSV: _from_csv,
    NPY: _from_npy,
}
_ENCODERS: dict[str, Callable[[Any], bytes]] = {JSON: _to_json, CSV: _to_csv, NPY: _to_npy}


def decode(data: bytes | bytearray | str, content_type: str | None) -> np.ndarray[Any, Any]:
    """The body as a NumPy array; ``UnsupportedFormat`` for a type other than the three."""
    decoder = _DECODERS.get(media_type(content_type))
    if decoder is None:
        raise UnsupportedFormat(content_type or "(none)")
    return decoder(data)


def encode(value: Any, content_type: str) -> bytes:
    """``value`` written as ``content_type`` (one of the three, else ``UnsupportedFormat``)."""
    encoder = _ENCODERS.get(media_type(content_type))
    if encoder is None:
        raise UnsupportedFormat(content_type)
    return encoder(value)


def choose_accept(accept: str) -> str:
    """The first type of an ``Accept`` list the encoders write (``UnsupportedFormat``
    naming the whole header when none is); ``*/*`` in the list means JSON."""
    for candidate in accept.split(","):
        media = media_type(candidate)
        if media == ANY:
            return JSON
        if media in _ENCODERS:
            return media
    raise UnsupportedFormat(accept)
