"""Request inputs to handler ``data`` rows, and handler outputs to response bodies."""

from __future__ import annotations

import io
import json
import sys
from typing import Any

from ferry.errors import InvalidInput
from ferry.protocols import tensor_bytes, untrusted_json
from ferry.wire.messages import InputPart, RequestItem


def _decode_part(part: InputPart) -> Any:
    media_type = part.content_type.split(";", 1)[0].strip().lower()
    if media_type == "application/json":
        try:
            return untrusted_json.loads(part.data)
        except ValueError as exc:
            raise InvalidInput(f"invalid JSON in {part.name!r}: {exc}") from exc
    if media_type == tensor_bytes.PAYLOAD_TYPE:  # a V2 request, as the frontend packed it
        return tensor_bytes.unpack_request(part.data, part.content_type)
    if media_type.startswith("text/"):
        try:
            return part.data.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise InvalidInput(f"{part.name!r} is not valid UTF-8 text") from exc
    # TorchServe hands binary inputs over as bytearray; handlers test for it.
    return bytearray(part.data)


def request_row(item: RequestItem) -> dict[str, Any]:
    """One ``data`` entry: the raw body under ``body``, or one key per form field.
    ``InvalidInput`` for a part that cannot be decoded, whatever the reason."""
    try:
        return {part.name: _decode_part(part) for part in item.parts}
    except InvalidInput:
        raise
    except MemoryError:
        raise InvalidInput("the request is too large to decode") from None
    except (ValueError, KeyError, IndexError, TypeError, RecursionError) as exc:
        raise InvalidInput(f"the request cannot be decoded: {exc}") from None


def _json_default(value: Any) -> Any:
    if hasattr(value, "tolist"):  # torch tensors, numpy arrays and scalars
        return value.tolist()
    if isinstance(value, (set, tuple)):
        return list(value)
    raise TypeError(f"{type(value).__name__} is not JSON serialisable")


def encode_output(value: Any, content_type: str | None) -> tuple[bytes, str]:
    """Bytes go out raw, str as text, a tensor as ``torch.save`` writes it (as TorchServe
    sends it: a workflow's next node, or a client, reads it with ``torch.load``), anything
    else as JSON (``ValueError`` when it cannot be written: not serialisable, circular, or
    nested too deeply)."""
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value), content_type or "application/octet-stream"
    if isinstance(value, str):
        return value.encode(), content_type or "text/plain; charset=utf-8"
    torch = sys.modules.get("torch")  # a handler that returns a tensor has imported it
    if torch is not None and isinstance(value, torch.Tensor):
        return _saved(torch, value), content_type or "application/octet-stream"
    try:
        text = json.dumps(value, default=_json_default)
    except RecursionError:
        raise ValueError("the answer is nested too deeply to write as JSON") from None
    return text.encode(), content_type or "application/json"


def _saved(torch: Any, tensor: Any) -> bytes:
    buffer = io.BytesIO()
    torch.save(tensor, buffer)
    return buffer.getvalue()
